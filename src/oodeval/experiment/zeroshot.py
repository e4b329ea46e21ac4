"""Zero-shot (VLM) cells of the grid: the text side and the scorers of ``oodeval.zeroshot``.

The context of a zero-shot model run holds the l2-normalised ID label embeddings ``id_text``
(C, E) and a loader of negative vocabularies. Label embeddings come from the model's
``features`` table when given there as ``.npy`` files (``text:id`` for the ID names, ``text:<vocab>``
for a vocabulary), else from ``oodeval.zeroshot.text.TextEncoder`` on the model's own text tower:
ID names from ``[datasets] id_classes`` (a file, one per line, or ``imagenet1k``) or the ID-test
manifest's class names; a vocabulary from its file (``Vocabulary`` JSON or one label per line).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

import numpy as np

from .._device import resolve_device
from .._io import hash_json
from ..data import resolve
from ..errors import InputError
from ..features import FeatureSet
from ..features.stream import iter_chunks
from ..scorer_factory import RunSets, build_scorer
from ..zeroshot.build import prompt_names, read_id_names
from ..zeroshot.models import load_clip
from ..zeroshot.scorers import create_scorer, scorer_names
from ..zeroshot.sweeps import save_sweep, sweep_prefix, sweep_siblings, sweeps_path
from ..zeroshot.text import TextEncoder, check_same_model
from ..zeroshot.vocabulary import Vocabulary
from .config import DetectorSpec, ExperimentConfig, ModelSpec

__all__ = ["run_sweeps", "build_context", "zeroshot_scores", "zeroshot_logits", "default_zeroshot_specs", "vocabulary_label",
           "vocabulary_generation", "vocabulary_source", "compact_generations",
           "patch_readouts", "gl_mcm_taus", "reset_text"]

_GENERATION = re.compile(r"^(?P<base>.+?)[-_.]gen(?P<gen>\d+)$")

#: the text side of the current zero-shot model run (emptied when a run starts, ``reset_text``)
_TEXT: dict[tuple, dict] = {}


def reset_text() -> None:
    """Forget the text side of the previous model run (its encoder and ID label embeddings)."""
    _TEXT.clear()


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _class_names(cfg: ExperimentConfig) -> list[str]:
    """``[datasets] id_classes`` (a file or ``imagenet1k``), else the ID-test manifest's names (wnids mapped)."""
    if cfg.id_classes is not None:
        return read_id_names(str(cfg.id_classes))[0]

    names = list(resolve(cfg.id_test.name, cfg.data_root).class_names or [])
    if not names:
        raise InputError("zero-shot models need the ID class names: set [datasets] id_classes to a text file (one per line) or 'imagenet1k'")
    return prompt_names(names, f"the class names of {cfg.id_test.name!r} (set [datasets] id_classes to override)")


def _encoder(model: ModelSpec, weights: str | None, cfg: ExperimentConfig):
    """An ``oodeval.zeroshot.text.TextEncoder`` for the model's text tower, cached under the store."""
    device = str(resolve_device(cfg.device))
    net, tokenizer, name = load_clip(model.name, weights=weights, pretrained=True if model.pretrained else None, device=device)
    return TextEncoder(net, tokenizer, name, weights=weights, cache_dir=cfg.store / "text")


def _vocab_labels(name: str) -> list[str]:
    """Labels of a vocabulary file: a ``Vocabulary`` JSON or a text file with one label per line (repeats kept once)."""
    return Vocabulary.load(name).labels


def vocabulary_label(name: str | None) -> str | None:
    """The short name of a vocabulary in the results (a file's stem, e.g. ``wordnet`` for wordnet.json)."""
    if name is None:
        return None
    return Path(name).stem if ("/" in name or "." in Path(name).name) else name


def vocabulary_generation(label: str) -> tuple[str, int | None]:
    """``("GPT", 3)`` for a vocabulary label ``GPT-gen3`` (one of repeated LLM generations, also
    ``_gen3`` / ``.gen3``), else ``(label, None)``: how results and report group generations."""
    m = _GENERATION.match(label)
    return (m["base"], int(m["gen"])) if m else (label, None)


def compact_generations(labels: list[str]) -> list[str]:
    """Labels in order with each run of generations of one vocabulary shown once: ``GPT-gen{0..9}``
    (``GPT-gen{0,2}`` when not contiguous), for listings such as ``run --check``."""
    groups: dict[str, list[int]] = {}
    order: list[str] = []
    for label in labels:
        base, gen = vocabulary_generation(label)
        key = base if gen is not None else f"\0{label}"
        if key not in groups:
            groups[key] = []
            order.append(key)
        if gen is not None:
            groups[key].append(gen)
    out = []
    for key in order:
        gens = sorted(groups[key])
        if not gens:
            out.append(key[1:])
        elif len(gens) == 1:
            out.append(f"{key}-gen{gens[0]}")
        elif gens == list(range(gens[0], gens[-1] + 1)):
            out.append(f"{key}-gen{{{gens[0]}..{gens[-1]}}}")
        else:
            out.append(f"{key}-gen{{{','.join(map(str, gens))}}}")
    return out


def vocabulary_source(path: str | None) -> str | None:
    """What made the vocabulary file ``path``, as canonical JSON for the results' ``vocabulary_source``
    column: its kind and content hash, and for an LLM vocabulary the prompt file (``"oodeval default"``
    for oodeval's own wording), a hash of the prompt texts, the LLM and the generation(s). None without a
    vocabulary; a file that cannot be read records the error (the cell itself fails on it)."""
    if path is None:
        return None
    p = Path(path)
    return _source(str(p), p.stat().st_mtime_ns if p.is_file() else None)


@lru_cache(maxsize=256)
def _source(path: str, _mtime: int | None) -> str:
    try:
        v = Vocabulary.load(path)
    except (OSError, ValueError) as exc:
        return json.dumps({"error": str(exc)})
    prov = v.provenance
    out = {"kind": v.kind, "content_hash": v.content_hash, "size": len(v)}
    if "prompts" in prov or "prompt_file" in prov:
        out.update(prompt_file=prov.get("prompt_file"), prompts_hash=hash_json(prov.get("prompts", {})))
    out.update({k: prov[k] for k in ("llm_model", "style", "generation", "generations") if k in prov})
    return json.dumps(out, sort_keys=True, separators=(",", ":"))


def _text_state(model: ModelSpec, weights: str | None, cfg: ExperimentConfig) -> dict:
    """The text side of one model run, shared by its extraction (patch readouts) and its scoring:
    ``{"encoder": TextEncoder or None (loaded on first use), "id_text": float64 unit (C, E) or None}``.
    Kept from the first call of a run (the runner calls :func:`reset_text` when one starts) to the next run."""
    key = (model.name, model.features.get("text:id"), weights, str(cfg.store), str(cfg.id_classes), str(cfg.id_test.name))
    if key not in _TEXT:
        _TEXT.clear()
        _TEXT[key] = {"encoder": None, "id_text": None}
    return _TEXT[key]


def _loader(state: dict, model: ModelSpec, weights: str | None, cfg: ExperimentConfig, check=None):
    """A callable returning the run's TextEncoder, loading it (then calling ``check(encoder)``) on first use."""
    def get():
        if state["encoder"] is None:
            enc = _encoder(model, weights, cfg)
            if check is not None:
                check(enc)
            state["encoder"] = enc
        return state["encoder"]

    return get


def _id_text(state: dict, model: ModelSpec, cfg: ExperimentConfig, encoder) -> np.ndarray:
    """The float64 unit ID label embeddings: the model's ``text:id`` file, else its text tower on the ID names."""
    if state["id_text"] is None:
        raw = np.load(model.features["text:id"]) if "text:id" in model.features else encoder().encode(_class_names(cfg), progress=True)
        state["id_text"] = _unit(raw)
    return state["id_text"]


def gl_mcm_taus(model: ModelSpec, cfg: ExperimentConfig) -> list[float]:
    """The temperatures of the model's gl_mcm scorers (its detector list, else the default scorers)."""
    specs = cfg.detectors_for(model)
    specs = default_zeroshot_specs() if specs is None else specs
    return sorted({float(create_scorer("gl_mcm", **s.hyperparameters).tau) for s in specs if s.name == "gl_mcm"})


def patch_readouts(model: ModelSpec, weights: str | None, cfg: ExperimentConfig) -> list:
    """The ``features.patchreadout.PatchReadout`` list a zero-shot model's extraction computes: the ID
    label embeddings (exactly those :func:`build_context` gives the scorers) at each gl_mcm tau."""
    from ..features.patchreadout import PatchReadout

    taus = gl_mcm_taus(model, cfg)
    if not taus:
        return []
    state = _text_state(model, weights, cfg)
    id_text = _id_text(state, model, cfg, _loader(state, model, weights, cfg))
    tower = None if state["encoder"] is None else state["encoder"].key["text_tower"]
    return [PatchReadout(id_text, tau, "id", tower) for tau in taus]


def build_context(model: ModelSpec, weights: str | None, cfg: ExperimentConfig, images: dict[str, FeatureSet] | None = None) -> dict:
    """``{"id_text": (C, E), "vocab": callable(name) -> (M, E) | None}`` for a zero-shot model run.

    Label embeddings come from the model's ``features`` table when given there as ``.npy`` files
    (``text:id``; ``text:<vocabulary>``), else from the model's text tower (cached under the store),
    after checking that it is the model that made the image features ``images`` (``check_same_model``).
    """
    state = _text_state(model, weights, cfg)
    if state["encoder"] is not None:  # loaded for the patch readouts, before these images existed
        check_same_model(state["encoder"].key["text_tower"], images or {})
    encoder = _loader(state, model, weights, cfg, lambda enc: check_same_model(enc.key["text_tower"], images or {}))

    def encode(labels: list[str]) -> np.ndarray:
        return encoder().encode(labels, progress=True)

    id_text = _id_text(state, model, cfg, encoder)
    cache: dict[str, np.ndarray] = {}

    def vocab(name: str | None) -> np.ndarray | None:
        if name is None:
            return None
        if name not in cache:
            key = f"text:{vocabulary_label(name)}"
            if key in model.features:
                cache[name] = _unit(np.load(model.features[key]))
            else:
                cache[name] = _unit(encode(_vocab_labels(name)))
        return cache[name]

    return {"id_text": id_text, "vocab": vocab}


def zeroshot_scores(spec: DetectorSpec, hp: dict, fs: FeatureSet, context: dict) -> np.ndarray:
    """Scores of zero-shot scorer ``spec`` on image embeddings ``fs``, streamed from the store in
    chunks and l2-normalised chunk by chunk (the zero-shot :class:`oodeval.scorer_factory.Scorer`)."""
    return build_scorer(spec.name, hp, RunSets(None, fs), kind="zero-shot", context=context, vocabulary=spec.vocabulary).score(fs)


def zeroshot_logits(fs: FeatureSet, context: dict, rows: int = 8192) -> np.ndarray | None:
    """Cosine similarities (N, C) float32 to the ID label embeddings (argmax = the zero-shot prediction),
    computed in chunks of ``rows`` streamed image rows."""
    if "id_text" not in context:
        return None
    out = np.empty((len(fs), len(context["id_text"])), np.float32)
    for part, chunk in iter_chunks({"features": fs.features}, rows):
        out[part] = _unit(chunk["features"]) @ context["id_text"].T
    return out


def _sweep_key(sweep, model: ModelSpec) -> str:
    """What a recorded curve depends on: the vocabulary's bytes (and its precomputed embeddings),
    sizes, scorer and hyperparameters; a curve recorded under another key is recomputed."""
    from ..features.backbones import file_hash

    files = [sweep.vocabulary, model.features.get(f"text:{vocabulary_label(sweep.vocabulary)}")]
    hashes = [file_hash(f) if f and Path(f).is_file() else f for f in files]
    key = [hashes, list(sweep.sizes), sweep.scorer, sweep.hyperparameters]
    return hash_json(key if sweep.kind == "prefix" else [*key, sweep.kind, sweep.seed])


def _siblings_curve(sweep, id_fs: FeatureSet, ood_fs: FeatureSet, context: dict) -> dict:
    """Fig. A1 / A3: the k-per-class sweep of an ``oodeval vocab llm`` vocabulary, every label
    embedded once (the vocabulary's own rows) and each k's pool picked from them."""
    vocab = Vocabulary.load(sweep.vocabulary)
    per_class = vocab.provenance.get("per_class")
    if not per_class:
        raise InputError(f"{sweep.vocabulary} has no per-class sibling lists (provenance.per_class); build it with `oodeval vocab llm`")
    rows = context["vocab"](sweep.vocabulary)
    index = {label: i for i, label in enumerate(vocab.labels)}
    missing = sorted({s for sibs in per_class.values() for s in sibs} - set(index))
    if missing:
        raise InputError(f"{sweep.vocabulary}: {len(missing)} per-class siblings are not among its labels, e.g. {missing[:3]}")
    embed = lambda labels: rows[[index[label] for label in labels]]  # noqa: E731
    return sweep_siblings(id_fs, ood_fs, context["id_text"], per_class, embed, sweep.sizes, sweep.seed, sweep.scorer,
                          **sweep.hyperparameters)


def default_zeroshot_specs() -> list[DetectorSpec]:
    """The seven logit-space scorers of Tab. 1. gl_mcm is always listed: on features without patch
    features its cells are recorded as errors saying why (never dropped silently)."""
    return [DetectorSpec(n) for n in scorer_names("logit")]


def run_sweeps(model: ModelSpec, feats: dict[str, FeatureSet], context: dict, errors: dict, cfg: ExperimentConfig, summary) -> None:
    """Fig. A1-A3 curves of one zero-shot model run on every OOD set, via ``oodeval.zeroshot.sweeps``
    (``sweep_prefix``, or ``sweep_siblings`` for ``kind = "siblings"``),
    recorded with :func:`oodeval.zeroshot.sweeps.save_sweep`; curves already recorded are skipped, failures
    are added to the summary's errors."""
    import pandas as pd


    path = sweeps_path(cfg.results)
    have = pd.read_parquet(path) if path.exists() else pd.DataFrame(columns=["sweep", "model", "dataset", "key"])
    done = set(zip(have["sweep"], have["model"], have["dataset"], have["key"] if "key" in have else [None] * len(have)))
    for sweep in cfg.sweeps:
        key = _sweep_key(sweep, model)
        for ds in cfg.ood:
            if (sweep.name, model.label, ds.label, key) in done:
                continue
            try:
                if "id_test" in errors or ds.label in errors or "id_text" not in context:
                    raise RuntimeError(errors.get("id_test") or errors.get(ds.label) or "no ID label embeddings")
                unit_fs = [FeatureSet(features=_unit(feats[k].features)) for k in ("id_test", ds.label)]
                if sweep.kind == "siblings":
                    curve = _siblings_curve(sweep, *unit_fs, context)
                else:
                    negatives = context["vocab"](sweep.vocabulary)
                    sizes = [m for m in sweep.sizes if m <= len(negatives)]
                    if not sizes:
                        raise InputError(f"every size of {sweep.sizes} exceeds the vocabulary's {len(negatives)} labels")
                    curve = sweep_prefix(*unit_fs, context["id_text"], negatives, sizes, scorer=sweep.scorer, **sweep.hyperparameters)
                save_sweep(cfg.results, sweep.name, model.label, ds.label, curve, key=key)
            except Exception as exc:  # noqa: BLE001 - recorded, the rest goes on
                summary.add_error(f"sweep {sweep.name} {model.label}/{ds.label}", f"{type(exc).__name__}: {exc}", sweep=True)
