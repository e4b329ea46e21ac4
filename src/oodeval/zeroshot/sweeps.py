"""Vocabulary-size sweeps (paper Fig. A1-A3): FPR@95 and AUROC of a vocabulary scorer as a function of

- the WordNet prefix size M of the NegMined ranking (Fig. A2), and
- the number k of LLM siblings kept per ID class, drawn in seeded random order (Fig. A1, A3).

Each returns a curve dict: ``{"param", "x", "vocab_size", "fpr95", "auroc"}`` (fractions), for the
report engineer to plot.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..errors import InputError
from ..features import FeatureSet
from ..metrics import all_metrics
from .llm_vocab import siblings_vocabulary
from .scorers import create_scorer

__all__ = ["sweep_prefix", "sweep_siblings"]


def _point(scorer, id_image, ood_image, id_text, neg) -> dict:
    res = all_metrics(scorer.score(id_image, id_text, neg), scorer.score(ood_image, id_text, neg))
    return {"fpr95": res["fpr95"], "auroc": res["auroc"]}


def sweep_prefix(
    id_image: FeatureSet | np.ndarray,
    ood_image: FeatureSet | np.ndarray,
    id_text: np.ndarray,
    ranked_negatives: np.ndarray,
    sizes: Sequence[int],
    scorer: str = "neglabel",
    **hyperparameters,
) -> dict:
    """FPR@95 vs M: the scorer with the first M rows of ``ranked_negatives`` (NegMined order)."""
    det = create_scorer(scorer, **hyperparameters)
    curve = {"param": "M", "x": [], "vocab_size": [], "fpr95": [], "auroc": []}
    for m in sizes:
        if not 0 <= m <= len(ranked_negatives):
            raise InputError(f"prefix size {m} outside [0, {len(ranked_negatives)}]")
        point = _point(det, id_image, ood_image, id_text, ranked_negatives[:m])
        curve["x"].append(int(m))
        curve["vocab_size"].append(int(m))
        curve["fpr95"].append(point["fpr95"])
        curve["auroc"].append(point["auroc"])
    return curve


def sweep_siblings(
    id_image: FeatureSet | np.ndarray,
    ood_image: FeatureSet | np.ndarray,
    id_text: np.ndarray,
    per_class: dict[str, list[str]],
    embed: Callable[[list[str]], np.ndarray],
    ks: Sequence[int],
    seed: int = 0,
    scorer: str = "neglabel",
    **hyperparameters,
) -> dict:
    """FPR@95 vs k: the pool of k siblings per class (seeded random order); ``embed(labels) -> (L, E)``."""
    det = create_scorer(scorer, **hyperparameters)
    curve = {"param": "k", "x": [], "vocab_size": [], "fpr95": [], "auroc": []}
    for k in ks:
        if k < 0:
            raise InputError(f"k must be >= 0, got {k}")
        vocab = siblings_vocabulary(per_class, k=k, seed=seed)
        neg = embed(vocab.labels) if len(vocab) else None
        point = _point(det, id_image, ood_image, id_text, neg)
        curve["x"].append(int(k))
        curve["vocab_size"].append(len(vocab))
        curve["fpr95"].append(point["fpr95"])
        curve["auroc"].append(point["auroc"])
    return curve
