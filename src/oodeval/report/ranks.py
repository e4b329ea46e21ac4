"""The report's rank statistics and the peers' other metrics.

- Tab. Ranks: the detectors' average ranks (1 = best) of the leading FPR@95 (``convention``) over
  the blocks, the Friedman test and Nemenyi post-hoc p-values against the best
  (:func:`oodeval.ranking.rank_detectors`); detectors no test separates from the best are bold.
  Blocks: one per model (its OOD sets averaged) with at least :data:`MIN_MODEL_BLOCKS` models,
  else one per model x OOD set (named in the caption, with the test and the correction).
- Fig. Ranks: the critical-difference diagram of the same result (scikit-posthocs).
- Tab. Metrics: per model and detector, the mean over the full OOD sets of AUROC, AUPR-In / -Out
  both as average precision (oodeval's) and as the trapezoid (OpenOOD's, pytorch-ood's; leading with
  ``convention="openood"``), AUTC, and AURC / AUGRC of the ID-test scores (the classifier's errors).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import InputError
from ..metrics import aupr_columns, fpr95_columns
from ..ranking import RankResult, cd_diagram, rank_detectors
from .labels import det_cell, detector_label
from .views import Cell, Figure, View, full_split, order_detectors, pct, register_view

__all__ = ["MIN_MODEL_BLOCKS", "report_ranks", "ranks_view", "peer_metrics", "ranks_figure"]

#: fewest models for one block per model; with fewer, each model x OOD set is a block
MIN_MODEL_BLOCKS = 5


def report_ranks(results: pd.DataFrame, convention: str = "paper") -> tuple[RankResult | None, str]:
    """(the rank statistics of the leading FPR@95 over the report's blocks, "") or (None, why not);
    vocabulary (zero-shot sweep) rows are left out, as in Tabs. 1 and A1."""
    metric = fpr95_columns(convention)[0][0]
    rows = results[results["vocabulary"].isna()]
    models = rows.loc[rows["status"] == "ok", "model"].nunique()
    by = "backbone" if models >= MIN_MODEL_BLOCKS else "backbone-ood"
    try:
        return rank_detectors(rows, metric, by, "nemenyi"), ""
    except InputError as err:
        return None, f"omitted: {err}"
    except ModuleNotFoundError as err:
        return None, f"omitted: {err}"


@register_view("tabRanks", order=57, needs=("results", "convention"))
def ranks_view(results: pd.DataFrame, convention: str = "paper") -> View:
    """Tab. Ranks (see the module doc)."""
    title = "Rank statistics — which detectors are significantly different from the best"
    result, note = report_ranks(results, convention)
    if result is None:
        return View("tabRanks", title, "", note=note)
    caption = (result.describe() + ". Bold: not significantly different from the best-ranked detector (p >= alpha); "
               "p vs best: the post-hoc p-value against it. Blocks are assumed independent (docs/experiments.md).")
    best = result.ranks.index[0]
    rows = []
    for det, r in result.ranks.items():
        same = det in result.same_as_best
        rows.append({"Detector": det_cell(det, bold=same), "Avg. rank": Cell(f"{r:.2f}", bold=same),
                     "p vs best": "–" if det == best else f"{result.pvalues.loc[best, det]:.3g}",
                     f"mean {result.metric} (%)": pct(float(result.matrix[det].mean()))})  # fmt: skip
    return View("tabRanks", title, caption, pd.DataFrame(rows))


@register_view("tabMetrics", order=58, needs=("frame", "convention"))
def peer_metrics(frame: pd.DataFrame, convention: str = "paper") -> View:
    """Tab. Metrics (see the module doc)."""
    title = "More metrics — AUPR both ways, AUTC, AURC / AUGRC"
    aupr = aupr_columns(convention)
    cols = [("auroc", "AUROC"), *aupr, ("autc", "AUTC"), ("aurc", "AURC"), ("augrc", "AUGRC")]
    caption = ("Per model and detector, the mean over its full OOD sets (%; no CI). AUPR AP: average precision (oodeval's, "
               "the papers'); AUPR trapz: the trapezoid under scikit-learn's precision-recall curve (OpenOOD's and "
               "pytorch-ood's; it differs from AP where ties or runs of one class span a step); AUTC: area under the "
               "threshold curve on min-max normalised scores (pytorch-ood's; lower is better); AURC / AUGRC: the detector's "
               "ID-test scores as the classifier's confidence, (generalised) risk of its own errors over coverage "
               "(lower is better; the same for every OOD set).")  # fmt: skip
    f = full_split(frame)
    f = f[f["vocabulary"].isna()]
    present = [(c, label) for c, label in cols if c in f.columns and f[c].notna().any()]
    if len(f) == 0 or not any(c in {"autc", "aurc", "augrc", "aupr_in_trapezoid"} for c, _ in present):
        return View("tabMetrics", title, caption, note="omitted: the results table predates these metrics (rerun `oodeval run`)")
    rows = []
    for m in dict.fromkeys(f["model"]):
        fm = f[f["model"] == m]
        for det in order_detectors(list(fm["det"])):
            g = fm[fm["det"] == det]
            rows.append({"Model": m, "Detector": det_cell(det),
                         **{label: pct(float(np.nanmean(g[c])) if g[c].notna().any() else np.nan) for c, label in present}})  # fmt: skip
    return View("tabMetrics", title, caption, pd.DataFrame(rows))


def ranks_figure(results: pd.DataFrame, convention: str, fig_dir: Path, formats: tuple[str, ...]) -> Figure:
    """Fig. Ranks: the CD diagram of :func:`report_ranks`, or a Figure with the note why it is omitted."""
    from . import figures as figs

    result, note = report_ranks(results, convention)
    fg = Figure("figRanks", "Critical-difference diagram", "")
    if result is None:
        fg.note = note
        return fg
    fg.caption = (f"Average rank of each detector (1 = best); a bar joins detectors no pairwise test separates. "
                  f"{result.describe()}.")
    fig = cd_diagram(result, label=detector_label)
    fg.path = figs.save_figure(fig, fig_dir / "ranks_cd.png", formats)
    return fg
