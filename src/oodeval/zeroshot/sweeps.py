"""Vocabulary-size sweeps (paper Fig. A1-A3): FPR@95 and AUROC of a vocabulary scorer as a function of

- the WordNet prefix size M of the NegMined ranking (Fig. A2), and
- the number k of LLM siblings kept per ID class, drawn in seeded random order (Fig. A1, A3).

Each returns a curve dict: ``{"param", "x", "vocab_size", "fpr95", "auroc"}`` (fractions);
:func:`save_sweep` records one in the sweeps table beside a results table (``<stem>.sweeps.parquet``),
which the report draws (Fig. A1 / A2) and the experiment runner fills.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from .._io import check_output, write_parquet_atomic
from ..errors import InputError
from ..features import FeatureSet
from ..metrics import all_metrics
from .llm_vocab import siblings_vocabulary
from .scorers import create_scorer
from .testtime import is_test_time, score_pair

__all__ = ["sweep_prefix", "sweep_siblings", "sweeps_path", "save_sweep"]


def _point(scorer, id_image, ood_image, id_text, neg) -> dict:
    """FPR@95 and AUROC of one pool; a test-time scorer (AdaNeg) scores the ID + OOD stream of order 0
    with fresh state (``oodeval.zeroshot.testtime``), as in its paper."""
    if is_test_time(scorer):
        s_id, s_ood, _ = score_pair(scorer, id_image, ood_image, id_text, neg)
        res = all_metrics(s_id, s_ood)
    else:
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


def sweeps_path(results: str | Path) -> Path:
    """Where vocabulary-size sweeps of a results table live: ``<stem>.sweeps.parquet`` beside it."""
    results = Path(results)
    return results.parent / f"{results.stem}.sweeps.parquet"


def save_sweep(results: str | Path, sweep: str, model: str, dataset: str, sizes, fpr95=None, key: str | None = None) -> Path:
    """Record one vocabulary-size curve (FPR@95 fractions against sizes) for Fig. A1 / A2.

    ``sizes`` is a sequence of sizes with ``fpr95`` beside it, or a curve dict of
    ``oodeval.zeroshot.sweeps`` (``{"param", "x", "fpr95", ...}``). ``sweep`` names the curve family;
    a name containing "wordnet" or a curve with param "M" is drawn as Fig. A2 (log x), otherwise
    Fig. A1. A curve with the same (sweep, model, dataset) is replaced. ``key`` records what the
    curve was computed from (the experiment runner recomputes a curve whose key changed).
    """
    param = ""
    if isinstance(sizes, dict):
        param = str(sizes.get("param", ""))
        sizes, fpr95 = sizes["x"], sizes["fpr95"]
    sizes = np.asarray(sizes, dtype=np.int64)
    fpr95 = np.asarray(fpr95, dtype=np.float64)
    if sizes.shape != fpr95.shape or sizes.ndim != 1 or sizes.size == 0:
        raise InputError(f"sizes and fpr95 must be equal-length 1-d arrays, got {sizes.shape} and {fpr95.shape}")
    path = check_output(sweeps_path(results), "sweeps table")
    new = pd.DataFrame({"sweep": sweep, "param": param, "model": model, "dataset": dataset, "size": sizes, "fpr95": fpr95, "key": key})
    if path.exists():
        old = pd.read_parquet(path)
        old = old[~((old["sweep"] == sweep) & (old["model"] == model) & (old["dataset"] == dataset))]
        new = pd.concat([old, new], ignore_index=True)
    write_parquet_atomic(path, new, "sweeps table")
    return path
