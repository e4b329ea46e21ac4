"""The report's PNG figures (matplotlib, Agg canvas, no pyplot state).

- Fig. 1: best FPR@95 per OOD set for one model (best of its detectors, named on the bar), with its 95% CI.
- ROC curves (ID positive) of one model's best detectors on the primary set (``sklearn.metrics.roc_curve``).
- ID vs OOD score histograms of each model's best detector on the primary set.
- Fig. A4: mean FPR@95 over sub-sampling draws ± 2 std against n, full-set values dotted, the
  primary set as a black reference line and a gray line at Tab. A6's draw size n.
- Fig. A1 / A2: vocabulary-size curves (one gray line per model, the mean in blue) from sweep tables.
- Fig. A3: FPR@95 against k negatives per ID class from the merged pool, mean over models, one line
  per OOD set (the primary set solid, the others dashed).
- Fig. 2 / A5: a gallery of certified OOD images, the verified label in green, the original in red.
Detectors are shown by the paper's labels (:func:`oodeval.report.labels.detector_label`).
Each function returns a matplotlib Figure (Agg canvas); :func:`save_figure` writes it atomically as
PNG (200 dpi, for the HTML page) with PDF and SVG beside it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .._extras import needs
from .._io import atomic_path
from ..errors import InputError
from .labels import detector_label

with needs():  # matplotlib is the report extra
    from matplotlib.figure import Figure

__all__ = ["save_figure", "FORMATS", "merged_pool", "gallery", "best_per_dataset", "roc_curves", "histograms", "subsampling_bands", "vocabulary_curves"]


FORMATS = ("png", "pdf", "svg")


def save_figure(fig: Figure, path: Path, formats: tuple[str, ...] = FORMATS) -> Path:
    """Write ``fig`` to ``path`` (``.png``, always) and beside it in the other ``formats`` (PDF, SVG),
    each atomically; returns the PNG path."""
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        raise InputError(f"figure format(s) {', '.join(unknown)} unknown; use {', '.join(FORMATS)}")
    path = Path(path).with_suffix(".png")
    for fmt in ("png", *[f for f in FORMATS[1:] if f in formats]):
        with atomic_path(path.with_suffix(f".{fmt}")) as tmp:
            fig.savefig(tmp, format=fmt, dpi=200 if fmt == "png" else None, bbox_inches="tight")
    return path


def best_per_dataset(best: pd.DataFrame, model: str) -> Figure:
    """Fig. 1 from ``best`` (columns dataset, fpr95, det; ``fpr95_lo`` / ``fpr95_hi`` where known),
    one bar per OOD set, sorted, with its bootstrap 95% CI as an error bar; a value of 0 still shows
    as a tick at the axis."""
    best = best.sort_values("fpr95")
    fig = Figure(figsize=(7, 0.45 * len(best) + 1.2))
    ax = fig.add_subplot()
    y = np.arange(len(best))
    v = 100 * best["fpr95"].to_numpy()
    ax.barh(y, v, color="0.6")
    ax.plot(v, y, "|", color="k", ms=12, mew=2)  # the value itself, visible at 0 too
    right = v
    if {"fpr95_lo", "fpr95_hi"} <= set(best.columns):
        lo, hi = 100 * best["fpr95_lo"].to_numpy(dtype=float), 100 * best["fpr95_hi"].to_numpy(dtype=float)
        known = np.isfinite(lo) & np.isfinite(hi)
        if known.any():
            ax.errorbar(v[known], y[known], xerr=[v[known] - lo[known], hi[known] - v[known]], fmt="none", ecolor="k", capsize=3, lw=1)
            right = np.where(known, hi, v)
    for yi, (r, val, d) in enumerate(zip(right, v, best["det"])):
        ax.text(r + 1.0, yi, f"{val:.1f} ({detector_label(d)})", va="center", fontsize=8)
    ax.set_yticks(y, list(best["dataset"]))
    ax.invert_yaxis()
    ax.set_xlim(0, 115)
    ax.set_xlabel("FPR@95 (%, lower is better)")
    ax.set_title(f"{model}: best detector per OOD set")
    return fig


def roc_curves(curves: dict[str, tuple[np.ndarray, np.ndarray]], title: str) -> Figure:
    """ROC (TPR of ID vs FPR of OOD) for each detector: label -> (ID scores, OOD scores)."""
    from sklearn.metrics import roc_curve

    fig = Figure(figsize=(5.5, 5))
    ax = fig.add_subplot()
    for label, (id_s, ood_s) in curves.items():
        y = np.r_[np.ones(id_s.size), np.zeros(ood_s.size)]
        fpr, tpr, _ = roc_curve(y, np.r_[id_s, ood_s])
        ax.plot(100 * fpr, 100 * tpr, label=detector_label(label), lw=1.4)
    ax.axhline(95, color="0.5", ls=":", lw=1)
    ax.plot([0, 100], [0, 100], color="0.8", lw=0.8)
    ax.set_xlabel("FPR: OOD accepted (%)")
    ax.set_ylabel("TPR: ID accepted (%)")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
    return fig


def histograms(panels: dict[str, tuple[str, np.ndarray, np.ndarray]], dataset: str) -> Figure:
    """One panel per model: title -> (detector, ID scores, OOD scores); densities with shared bins."""
    from matplotlib.ticker import MaxNLocator

    k = len(panels)
    cols = min(k, 3)
    rows = int(np.ceil(k / cols))
    fig = Figure(figsize=(4.2 * cols, 3.2 * rows), layout="constrained")  # panels never overlap their neighbours' ticks
    for i, (model, (det, id_s, ood_s)) in enumerate(panels.items()):
        ax = fig.add_subplot(rows, cols, i + 1)
        ax.xaxis.set_major_locator(MaxNLocator(5))
        ax.tick_params(labelsize=7)
        lo, hi = min(id_s.min(), ood_s.min()), max(id_s.max(), ood_s.max())
        bins = np.linspace(lo, hi if hi > lo else lo + 1, 40)
        ax.hist(id_s, bins=bins, density=True, alpha=0.55, label=f"ID (n={id_s.size})")
        ax.hist(ood_s, bins=bins, density=True, alpha=0.55, label=f"{dataset} (n={ood_s.size})")
        k95 = int(np.ceil(0.95 * id_s.size))
        ax.axvline(np.sort(id_s)[::-1][k95 - 1], color="k", ls="--", lw=1, label="TPR95 threshold")
        ax.set_title(f"{model} / {detector_label(det)}", fontsize=9)
        ax.set_xlabel("score (higher = ID)")
        ax.set_ylabel("density")
        ax.legend(fontsize=7)
    return fig


def subsampling_bands(curves: dict, model: str, reference: tuple[str, float] | None, n_ref: int | None) -> Figure:
    """Fig. A4 from :func:`oodeval.report.subsampling.subsampling_curves`."""
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    markers = "osD^v<>ph*"
    for i, (dataset, c) in enumerate(curves.items()):
        color = f"C{i}"
        m, s = 100 * c["mean"], 100 * c["std"]
        # hollow markers shrinking series by series: lines that coincide (all at 0) stay visible
        ax.plot(c["n"], m, color=color, marker=markers[i % len(markers)], ms=max(10 - 2 * i, 3), mfc="none", mew=1.2,
                label=f"{dataset} ({detector_label(c['detector'])})", zorder=3)  # fmt: skip
        ax.fill_between(c["n"], np.clip(m - 2 * s, 0, 100), np.clip(m + 2 * s, 0, 100), color=color, alpha=0.2)
        ax.axhline(100 * c["full"], color=color, ls=":", lw=1)
    if reference is not None:
        ax.axhline(100 * reference[1], color="k", lw=1.5, label=f"{reference[0]} (full)")
    if n_ref:
        ax.axvline(n_ref, color="0.6", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("draw size n (log)")
    ax.set_ylabel("FPR@95 (%), mean ± 2 std over draws (clipped to [0, 100])")
    ax.set_ylim(-4, 104)  # a series at 0 or 100 is not hidden by the frame
    ax.set_title(f"{model}: FPR@95 on random subsets")
    ax.legend(fontsize=7)
    return fig


def vocabulary_curves(sweep: pd.DataFrame, title: str, xlabel: str, log_x: bool = False) -> Figure:
    """Fig. A1/A2: FPR@95 against vocabulary size, gray per model, blue the mean over models.

    ``sweep`` columns: model, size, fpr95 (fractions).
    """
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    for model, g in sweep.groupby("model", sort=False):
        g = g.sort_values("size")
        ax.plot(g["size"], 100 * g["fpr95"], color="0.65", lw=1)
        ax.annotate(str(model), (g["size"].iloc[-1], 100 * g["fpr95"].iloc[-1]), fontsize=6, color="0.4")
    mean = sweep.groupby("size")["fpr95"].mean()
    ax.plot(mean.index, 100 * mean.to_numpy(), color="C0", lw=2, label="mean over models")
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("FPR@95 (%)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return fig


def merged_pool(sweep: pd.DataFrame, primary: str) -> Figure:
    """Fig. A3 from a sweep table (columns model, dataset, size, fpr95): the mean over models per
    OOD set against k; the primary set solid, the others dashed."""
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    for i, (dataset, g) in enumerate(sweep.groupby("dataset", sort=False)):
        mean = g.groupby("size")["fpr95"].mean()
        ax.plot(mean.index, 100 * mean.to_numpy(), color="k" if dataset == primary else f"C{i}", ls="-" if dataset == primary else "--", lw=2 if dataset == primary else 1.2, label=str(dataset))
    ax.set_xlabel("negatives kept per ID class k")
    ax.set_ylabel("FPR@95 (%), mean over models")
    ax.set_title("Size of the merged per-class negative pool")
    ax.legend(fontsize=7)
    return fig


def gallery(items: list[tuple[Path, str, str]], title: str, cols: int = 7) -> Figure:
    """Images with the verified OOD label (green) above the original label (red)."""
    from PIL import Image

    rows = int(np.ceil(len(items) / cols))
    fig = Figure(figsize=(2.1 * cols, 2.5 * rows))
    for i, (image, verified, original) in enumerate(items):
        ax = fig.add_subplot(rows, cols, i + 1)
        with Image.open(image) as im:
            im = im.convert("RGB")
            im.thumbnail((256, 256))
            ax.imshow(np.asarray(im))
        ax.set_axis_off()
        ax.set_title(verified, fontsize=8, color="green", pad=12)
        ax.text(0.5, 1.01, original, transform=ax.transAxes, ha="center", va="bottom", fontsize=7, color="red")
    fig.suptitle(title)
    return fig
