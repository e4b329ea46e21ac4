"""Sub-sampling views (paper App. C): Tab. A6 and the data of Fig. A4.

For one model, every OOD set (whole set) with stored scores: the detector with the lowest full-set
FPR@95 is selected once; ``draws`` random subsets of ``n`` OOD images are drawn without replacement
with the ID set (hence the threshold) fixed (``oodeval.stats.subsample``); reported are the mean,
bias (mean - full) and standard deviation (ddof=1) over the draws, the closed-form standard error
sqrt(p(1-p)/n) * sqrt((N-n)/(N-1)) at the full-set p (``oodeval.stats.standard_error``, Eq. 5 with the
finite-population correction) and the mean Spearman rho between the detector ranking on a draw and on
the full set (``oodeval.stats.rank_stability``, all detectors). A set with N <= n gets only the
plug-in closed form (no correction), as the paper's Fi-ImageNet-1k row. The default n
(:func:`default_subsample_n`) is the paper's, the primary set's size, capped at half the smallest
other OOD set, so that every other set is drawn from.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..metrics import auroc, fpr_at_tpr
from ..results import ALL_SPLIT, load_cell_scores
from ..stats import rank_stability, standard_error, subsample
from .labels import det_cell
from .views import View, add_det, best_row, pct, register_view

__all__ = ["model_scores", "subsampling_table", "subsampling_view", "subsampling_curves", "chunked_subsample", "default_subsample_n"]

_CHUNK = 4_000_000  # draws x m entries per call of stats.subsample
#: the largest share of the smallest other OOD set the default n takes (at n = N a draw is the whole set)
DEFAULT_SHARE = 0.5


def model_scores(df: pd.DataFrame, results_path: Path, model: str) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """dataset -> detector label -> (ID scores, OOD scores) of ``model`` on whole OOD sets, from
    the first seed's vocabulary-free rows."""
    rows = df[(df["status"] == "ok") & (df["model"] == model) & (df["split"] == ALL_SPLIT) & df["vocabulary"].isna()]
    if len(rows) == 0:
        return {}
    rows = rows[rows["seed"] == rows["seed"].min()]
    rows = rows[rows["weights"] == rows["weights"].iloc[0]]
    out: dict[str, dict] = {}
    for _, r in add_det(rows).iterrows():
        try:
            out.setdefault(r["dataset"], {})[r["det"]] = load_cell_scores(r, results_path)
        except (OSError, ValueError):
            continue
    return out


def _size(scores: dict, dataset: str) -> int:
    return next(iter(scores[dataset].values()))[1].size


def default_subsample_n(scores: dict, primary: str | None) -> tuple[int | None, str]:
    """Tab. A6's default draw size and the caption's sentence saying why: the paper's n, the primary
    set's size N_p (Fi-ImageNet-1k's 655, smaller than every other set), capped at
    floor(:data:`DEFAULT_SHARE` x N_min), N_min the smallest other OOD set, so that no other set is
    drawn whole (n >= N leaves its row without draws: mean = full, std 0, no rho). Where the primary
    set is the smallest, this is N_p and its own row has the closed form only, as in the paper.
    (None, "") without stored scores on the primary set."""
    if primary not in scores:
        return None, ""
    n_p = _size(scores, primary)
    others = {d: _size(scores, d) for d in scores if d != primary}
    if not others:
        return n_p, f"n = the primary set's size ({primary}, the paper's choice)."
    smallest = min(others, key=others.get)
    cap = max(1, int(DEFAULT_SHARE * others[smallest]))
    if n_p <= cap:
        return n_p, f"n = the primary set's size ({primary}, the paper's choice)."
    return cap, (f"n = {cap}: the paper's n, the primary set's size ({n_p}, {primary}), capped at {DEFAULT_SHARE:g} x the smallest "
                 f"other OOD set ({smallest}, N = {others[smallest]}) so that every set is drawn from, not drawn whole (the default; `report --n` sets n).")


def _best(names: list[str], dets: dict, full: np.ndarray) -> int:
    """Index of the best detector by the report's one rule (:func:`views.best_row`)."""
    frame = pd.DataFrame({"det": names, "fpr95": full, "auroc": [auroc(*dets[d]) for d in names]})
    return names.index(best_row(frame)["det"])


def chunked_subsample(id_scores: np.ndarray, ood_scores: np.ndarray, n: int, draws: int, seed: int):
    """``stats.subsample`` in chunks of draws (seeds seed, seed+1, ...) to bound memory; returns
    (fpr (K, draws), full_fpr (K,))."""
    m = ood_scores.shape[-1]
    step = max(1, min(draws, _CHUNK // max(m, 1)))
    parts = []
    full = None
    for i, start in enumerate(range(0, draws, step)):
        res = subsample(id_scores, ood_scores, n, draws=min(step, draws - start), seed=seed + i)
        parts.append(res.fpr)
        full = res.full_fpr
    return np.concatenate(parts, axis=1), full


TITLE = "Tab. A6 — sub-sampling to n images"


def subsampling_table(scores: dict, n: int, draws: int = 1000, seed: int = 0, model: str = "", why: str = "") -> View:
    """Tab. A6 for one model's scores (:func:`model_scores`) at draw size ``n``; ``why``: the
    caption's sentence on how n was chosen."""
    title = TITLE
    caption = (
        f"{model}: each OOD set re-evaluated on {draws} random draws of n={n} images without replacement, the ID "
        "set and the detector (best full-set FPR@95, named) fixed. full / mean / bias / std (ddof=1 over the draws) "
        "in FPR@95 %; closed form: sqrt(p(1-p)/n) x sqrt((N-n)/(N-1)) at p = full (Eq. 5 with the finite-population "
        "correction; plug-in without it where N <= n); rho: mean Spearman correlation of the detector ranking on a draw "
        "vs the full set." + (f" {why}" if why else "")
    )
    if not scores:
        return View("tabA6", title, caption, note="omitted: no stored scores")
    rows = []
    for dataset, dets in scores.items():
        names = list(dets)
        id_m = np.stack([dets[d][0] for d in names])
        ood_m = np.stack([dets[d][1] for d in names])
        N = ood_m.shape[1]
        full = np.array([fpr_at_tpr(id_m[k], ood_m[k]) for k in range(len(names))])
        b = _best(names, dets, full)
        row = {"Dataset": dataset, "N": str(N), "n/N (%)": f"{100 * min(n, N) / N:.1f}", "full": pct(full[b], 2), "detector": det_cell(names[b])}
        if N <= n:
            row.update({"mean": "–", "bias": "–", "std": "–", "closed form": pct(standard_error(full[b], N), 2), "rho": "–"})
        else:
            fpr, full_fpr = chunked_subsample(id_m, ood_m, n, draws, seed)
            d = fpr[b]
            try:
                rho = rank_stability(fpr, full_fpr) if len(names) > 1 and np.ptp(full_fpr) > 0 else float("nan")
            except ValueError:  # every draw ties all detectors: no ranking to compare
                rho = float("nan")
            row.update(
                {
                    "mean": pct(d.mean(), 2),
                    "bias": f"{100 * (d.mean() - full[b]):+.2f}",
                    "std": pct(d.std(ddof=1), 2) if draws > 1 else "–",
                    "closed form": pct(standard_error(full[b], n, N), 2),
                    "rho": "–" if not np.isfinite(rho) else f"{rho:.3f}",
                }
            )
        rows.append(row)
    return View("tabA6", title, caption, pd.DataFrame(rows))


@register_view("tabA6", order=90, needs=("scores", "subsample_n", "draws", "seed", "model", "primary"))
def subsampling_view(scores: dict, n: int | None, draws: int, seed: int, model: str | None, primary: str | None = None) -> View:
    """Tab. A6 as the report shows it: :func:`subsampling_table` at ``n`` (None:
    :func:`default_subsample_n`), or a note when the figure model has no stored scores or no draw
    size is known."""
    why = ""
    if n is None:
        n, why = default_subsample_n(scores, primary)
    if scores and n:
        return subsampling_table(scores, n, draws=draws, seed=seed, model=model, why=why)
    return View("tabA6", TITLE, "", note="omitted: no stored scores for a model on the primary set")


def subsampling_curves(scores: dict, draws: int = 1000, seed: int = 0, points: int = 8, max_sets: int = 6) -> dict:
    """Fig. A4 data: dataset -> {"n": sizes, "mean", "std" (FPR@95 fractions over draws), "full", "detector"}.

    Sizes are ``points`` log-spaced values from 10 to N - 1 for the ``max_sets`` largest sets.
    """
    out = {}
    ranked = sorted(scores, key=lambda d: -next(iter(scores[d].values()))[1].size)[:max_sets]
    for dataset in ranked:
        dets = scores[dataset]
        names = list(dets)
        full = np.array([fpr_at_tpr(*dets[d]) for d in names])
        b = _best(names, dets, full)
        id_s, ood_s = dets[names[b]]
        N = ood_s.size
        if N < 12:
            continue
        sizes = np.unique(np.geomspace(10, N - 1, points).astype(int))
        means, stds = [], []
        for n in sizes:
            fpr, _ = chunked_subsample(id_s, ood_s, int(n), draws, seed)
            means.append(fpr[0].mean())
            stds.append(fpr[0].std(ddof=1))
        out[dataset] = {"n": sizes, "mean": np.array(means), "std": np.array(stds), "full": full[b], "detector": names[b]}
    return out
