"""CSP, the conjugated semantic pool (Chen, Gao & Xu, NeurIPS 2024, arXiv 2410.08611).

From the authors' release MengyuanChen21/NeurIPS2024-CSP (commit 3a7bdabeb89301053ba8bfc56b227b6d81b273e9):
mmcls/models/classifiers/multi_modal.py (``CLIPScalableClassifier``), class_names.py (``csp_templates``),
custom_config/clip-ViT-B16.py (the ImageNet run), mmcls/models/ood/clip_ood.py (the score):

- Nouns: head lemmas of the WordNet noun lexicographer files except noun.person, noun.quantity and
  noun.group (``txt_exclude``); adjectives: those of adj.all and adj.ppl (adj.pert excluded). Labels
  are de-duplicated across files, first occurrence kept.
- The conjugated pool: each adjective is joined to one superclass word drawn with Python's
  ``random.seed(seed)`` / ``random.choice`` over :data:`SUPERCLASSES` (``"{adj} {superclass}"``, e.g.
  "lively creature"), in lexicon order, seed 0.
- Selection (``pos_neg_sim='neg_centroid'``, ``neg_topk=0.15``, ``pencentile=0.95``): d_j = the 95th
  percentile over ID classes of cos(t_j, t_c), set to 1 where max_c cos > 0.95; the nouns and the
  conjugated labels are ranked separately by d (ascending) and the first 15% of each kept, nouns first.
- The score is NegLabel's grouped Eq. 3 (G = 100, t = 1 on CLIP's 100-scaled logits, i.e. tau = 0.01):
  :class:`CSP` below, to be given the pool (``oodeval vocab csp``).

Differences, stated: the lexicon comes from Debian's WordNet 3.0 WNDB files through
:mod:`oodeval.zeroshot.wordnet` (head lemma of each synset of the lexicographer file, normalised as
there); the release's own text files list 10,007 adj.all heads where this gives 10,994 (9,938 shared);
the other files agree within a few labels. Ties in d are broken by the label (the release's torch
argsort leaves them unspecified). Text prompts (the release ensembles 8 noun / 4 adjective templates)
are those of oodeval's text encoder.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import InputError
from .scorers import NegLabel, register
from .vocabulary import Vocabulary
from .wordnet import DEFAULT_WORDNET, normalise, synsets

__all__ = ["SUPERCLASSES", "NOUN_EXCLUDED", "ADJ_FILES", "lexfile_heads", "conjugated_labels", "csp_distance",
           "select_pool", "build_csp", "CSP"]

#: the superclass words of the release's ``csp_templates`` ("{} environment", ...), in its order
SUPERCLASSES = ("environment", "space", "object", "scene", "place", "item", "area", "view", "thing", "pattern",
                "structure", "landscape", "vista", "creature")  # fmt: skip
#: noun lexicographer files left out (custom_config ``txt_exclude``)
NOUN_EXCLUDED = ("noun.person", "noun.quantity", "noun.group")
#: adjective lexicographer files used (adj.pert excluded)
ADJ_FILES = ("adj.all", "adj.ppl")

# WordNet 3.0 lexicographer file numbers (lexnames): 0 adj.all, 1 adj.pert, 44 adj.ppl, 3..28 nouns
_NOUN_FILES = ("noun.Tops", "noun.act", "noun.animal", "noun.artifact", "noun.attribute", "noun.body", "noun.cognition",
               "noun.communication", "noun.event", "noun.feeling", "noun.food", "noun.group", "noun.location",
               "noun.motive", "noun.object", "noun.person", "noun.phenomenon", "noun.plant", "noun.possession",
               "noun.process", "noun.quantity", "noun.relation", "noun.shape", "noun.state", "noun.substance",
               "noun.time")  # fmt: skip
LEXFILES = {"adj.all": 0, "adj.pert": 1, "adj.ppl": 44, **{name: 3 + i for i, name in enumerate(_NOUN_FILES)}}


def lexfile_heads(names: Sequence[str], folder: str | Path = DEFAULT_WORDNET) -> list[str]:
    """Distinct normalised head lemmas of the synsets of lexicographer files ``names`` (file order)."""
    unknown = [n for n in names if n not in LEXFILES]
    if unknown:
        raise InputError(f"unknown WordNet lexicographer files {unknown}")
    out: dict[str, None] = {}
    for pos in sorted({n.split(".")[0] for n in names}):
        wanted = {LEXFILES[n] for n in names if n.startswith(pos + ".")}
        for syn in synsets(pos, folder):
            if syn.lexfile in wanted:
                out.setdefault(normalise(syn.lemmas[0]), None)
    return list(out)


def conjugated_labels(adjectives: Sequence[str], seed: int = 0) -> list[str]:
    """``"{adjective} {superclass}"`` with one superclass per adjective from ``random.Random(seed).choice``."""
    rng = random.Random(seed)
    return [f"{adj} {rng.choice(SUPERCLASSES)}" for adj in adjectives]


def csp_distance(candidates: np.ndarray, id_text: np.ndarray, percentile: float = 95.0, near: float = 0.95) -> np.ndarray:
    """d_j = the ``percentile`` over ID classes of cos(t_j, t_c) (linear interpolation, as ``torch.quantile``);
    1 where max_c cos > ``near``. float64 (K,), in row chunks."""
    id_text = np.asarray(id_text, dtype=np.float64)
    if np.ndim(candidates) != 2 or id_text.ndim != 2 or np.shape(candidates)[1] != id_text.shape[1]:
        raise InputError(f"need candidates (K, E) and ID embeddings (C, E); got {np.shape(candidates)} and {id_text.shape}")
    d = np.empty(len(candidates))
    for start in range(0, len(candidates), 4096):
        sims = np.asarray(candidates[start : start + 4096], dtype=np.float64) @ id_text.T
        part = np.percentile(sims, percentile, axis=1)
        part[sims.max(axis=1) > near] = 1.0
        d[start : start + 4096] = part
    return d


def select_pool(nouns: Sequence[str], noun_emb: np.ndarray, conj: Sequence[str], conj_emb: np.ndarray, id_text: np.ndarray,
                fraction: float = 0.15, percentile: float = 95.0) -> tuple[list[str], int]:
    """The kept labels (nouns first, each part least ID-like first) and how many are nouns."""
    if not 0 < fraction <= 1:
        raise InputError(f"fraction must lie in (0, 1], got {fraction}")
    kept = []
    for labels, emb in ((nouns, noun_emb), (conj, conj_emb)):
        if len(labels) != len(emb):
            raise InputError(f"{len(labels)} labels but {len(emb)} embeddings")
        d = csp_distance(emb, id_text, percentile)
        order = np.lexsort((np.asarray(labels, dtype=str), d))
        kept.append([labels[i] for i in order[: int(len(labels) * fraction)]])
    return kept[0] + kept[1], len(kept[0])


def build_csp(encoder, id_names: Sequence[str], folder: str | Path = DEFAULT_WORDNET, fraction: float = 0.15,
              seed: int = 0, percentile: float = 95.0, progress: bool = True) -> Vocabulary:
    """The CSP pool for ``id_names``: mined nouns then mined conjugated labels (module docstring)."""
    noun_files = [n for n in _NOUN_FILES if n not in NOUN_EXCLUDED]
    nouns = lexfile_heads(noun_files, folder)  # ID names are not removed (the release's pos_topk None): d = 1 ranks them last
    adjectives = [w for w in lexfile_heads(ADJ_FILES, folder) if w not in set(nouns)]
    conj = conjugated_labels(adjectives, seed)
    id_text = encoder.encode(list(id_names), progress=progress)
    labels, n_nouns = select_pool(nouns, encoder.encode(nouns, progress=progress), conj,
                                  encoder.encode(conj, progress=progress), id_text, fraction, percentile)
    prov = {"source": "CSP: WordNet nouns + conjugated adjective-superclass labels", "wordnet": str(folder),
            "noun_files": noun_files, "adj_files": list(ADJ_FILES), "superclasses": list(SUPERCLASSES),
            "fraction": fraction, "percentile": percentile, "seed": seed, "nouns": n_nouns,
            "conjugated": len(labels) - n_nouns, "encoder": encoder.key, "id_names": len(id_names)}  # fmt: skip
    return Vocabulary(labels, "csp", prov)


@register("csp", 10, vocabulary=True)
class CSP(NegLabel):
    """CSP's score: NegLabel's grouped Eq. 3 (n_groups = 100, seed = 0; clip_ood.py ``ScalableClassifier``)
    over the conjugated semantic pool, which is the vocabulary given (``oodeval vocab csp``,
    :func:`build_csp`); with another vocabulary it is NegLabel on that vocabulary."""

    label = "CSP"
