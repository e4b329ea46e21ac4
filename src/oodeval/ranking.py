"""Rank statistics over a results table: is detector A better than detector B over the blocks?

The procedure of Demšar (2006, "Statistical comparisons of classifiers over multiple data sets",
JMLR 7) as the systematic analyses of OOD detectors apply it: the detectors are ranked within each
block (a backbone, or a backbone x OOD set; rank 1 = best, ties share the mean rank), the
Friedman test asks whether any detector differs, a post-hoc test compares every pair, and a
critical-difference (CD) diagram draws the average ranks with a bar over each group that no
test separates. Everything but the matrix of values is computed by libraries made for it:
the Friedman chi-square by :func:`scipy.stats.friedmanchisquare`, the pairwise p-values by
scikit-posthocs (``posthoc_nemenyi_friedman``; ``posthoc_conover_friedman`` and
``posthoc_wilcoxon`` with the Holm correction), the diagram by its ``critical_difference_diagram``,
and Nemenyi's CD, q_alpha sqrt(k (k + 1) / (6 N)), from scipy's studentized-range quantile.

Assumptions (docs/experiments.md "Rank statistics"): the blocks are independent (two OOD sets
scored on one backbone share its errors, so backbones x OOD sets overstates N), every detector
has a value in every block (a model x OOD set missing one is dropped, and named), and the Friedman test's
chi-square approximation wants N >= 10 blocks or so with k >= 3 detectors (Demšar, Sec. 3.2.2).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.stats import friedmanchisquare, rankdata, studentized_range

from ._extras import needs
from .errors import InputError
from .results import ALL_SPLIT

__all__ = ["BLOCKS", "TESTS", "LOWER_IS_BETTER", "RankResult", "rank_matrix", "rank_detectors", "cd_diagram"]

#: metrics where a lower value is better (every other metric column: higher is better)
LOWER_IS_BETTER = frozenset({"fpr95", "fpr95_ood_positive", "detection_error", "autc", "aurc", "augrc"})

#: ``--by`` -> the results columns that make one block: ``backbone`` one block per evaluated model
#: (the network, the ``model`` column; its OOD sets averaged), ``backbone-ood`` one per model x OOD set
BLOCKS = {"backbone": ("model",), "backbone-ood": ("model", "dataset")}

#: post-hoc test -> (scikit-posthocs function, its multiplicity correction, description)
TESTS = {
    "nemenyi": ("posthoc_nemenyi_friedman", None, "Nemenyi (studentized range; controls the family-wise error itself)"),
    "conover": ("posthoc_conover_friedman", "holm", "Conover on the Friedman ranks, Holm-corrected"),
    "wilcoxon": ("posthoc_wilcoxon", "holm", "Wilcoxon signed-rank per pair, Holm-corrected"),
}


@dataclass(frozen=True)
class RankResult:
    """The rank statistics of one metric over one blocking.

    ``matrix`` (blocks x detectors) holds the values ranked; ``ranks`` the average rank of each
    detector (1 = best), best first; ``pvalues`` the pairwise post-hoc p-values (already corrected
    by ``correction``); ``cd`` Nemenyi's critical difference (None for the other tests);
    ``same_as_best`` the detectors no test separates from the best-ranked one at ``alpha``;
    ``dropped`` the (model / OOD set) pairs left out because a detector has no value there."""

    metric: str
    by: str
    test: str
    correction: str | None
    alpha: float
    matrix: pd.DataFrame
    ranks: pd.Series
    statistic: float
    pvalue: float
    pvalues: pd.DataFrame
    cd: float | None
    same_as_best: list[str]
    dropped: list[str] = field(default_factory=list)

    @property
    def n_blocks(self) -> int:
        return int(self.matrix.shape[0])

    def describe(self) -> str:
        """One sentence naming the blocks, the tests and the correction (printed beside the figure)."""
        better = "lower" if self.metric in LOWER_IS_BETTER else "higher"
        cd = f"; Nemenyi CD = {self.cd:.3f}" if self.cd is not None else ""
        return (f"{self.metric} ({better} is better) ranked within each of N = {self.n_blocks} blocks "
                f"({self.by}: {' x '.join(BLOCKS[self.by])}), k = {self.matrix.shape[1]} detectors; Friedman "
                f"chi2 = {self.statistic:.3f}, p = {self.pvalue:.3g}; post-hoc: {TESTS[self.test][2]}, alpha = {self.alpha}{cd} "
                "(scipy, scikit-posthocs)")  # fmt: skip


def rank_matrix(results: pd.DataFrame, metric: str, by: str = "backbone", ood: list[str] | None = None,
                detectors: list[str] | None = None) -> tuple[pd.DataFrame, list[str]]:
    """(blocks x detectors matrix of ``metric``, the blocks dropped) from a results table: its ok
    rows over whole OOD sets (split ``all``), the mean over seeds (and, for ``by="backbone"``, over
    the OOD sets ``ood``, default all). A detector is the ``detector`` column with its explicit
    hyperparameters when one detector ran with several. A (model, OOD set) where some detector has no
    value is dropped (and named) before blocks are formed, so every detector of a model is averaged
    over the same OOD sets."""
    if by not in BLOCKS:
        raise InputError(f"--by must be one of {', '.join(BLOCKS)}, got {by!r}")
    if metric not in results.columns:
        raise InputError(f"metric {metric!r} is not a column of the results table")
    f = results[(results["status"] == "ok") & (results["split"] == ALL_SPLIT)]
    if ood:
        unknown = sorted(set(ood) - set(f["dataset"]))
        if unknown:
            raise InputError(f"OOD set(s) {', '.join(unknown)} not in the results; it has {', '.join(sorted(set(f['dataset'])))}")
        f = f[f["dataset"].isin(ood)]
    f = f.assign(_det=_detector_labels(f))
    if detectors:
        unknown = sorted(set(detectors) - set(f["_det"]))
        if unknown:
            raise InputError(f"detector(s) {', '.join(unknown)} not in the results; it has {', '.join(sorted(set(f['_det'])))}")
        f = f[f["_det"].isin(detectors)]
    f = f[f[metric].notna()]
    if len(f) == 0:
        raise InputError(f"no ok row of the results table has a value of {metric!r}")
    per = f.groupby(["model", "dataset", "_det"], sort=False)[metric].mean().reset_index()
    wide = per.pivot_table(index=["model", "dataset"], columns="_det", values=metric, sort=False)
    wide.columns.name = None
    complete = wide.notna().all(axis=1)
    dropped = [f"{m} / {d}" for m, d in wide.index[~complete]]
    wide = wide[complete]
    if by == "backbone":  # each model's mean over the OOD sets where every detector has a value
        wide = wide.groupby(level="model", sort=False).mean()
        wide.index = [str(m) for m in wide.index]
    else:
        wide.index = [f"{m} / {d}" for m, d in wide.index]
    return wide, dropped


def _detector_labels(f: pd.DataFrame) -> pd.Series:
    """``detector``, or ``detector {hyperparameters}`` where one detector ran with several settings."""
    hp = f["hyperparameters"].fillna("{}")
    several = f.groupby("detector")["hyperparameters"].transform("nunique") > 1
    return f["detector"].where(~several, f["detector"] + " " + hp)


def rank_detectors(results: pd.DataFrame, metric: str = "fpr95", by: str = "backbone", test: str = "nemenyi",
                   alpha: float = 0.05, ood: list[str] | None = None, detectors: list[str] | None = None) -> RankResult:
    """Friedman test, average ranks, pairwise post-hoc p-values and Nemenyi's CD of ``metric`` over
    the blocks ``by`` (:data:`BLOCKS`) of a results table; ``test`` one of :data:`TESTS`."""
    if test not in TESTS:
        raise InputError(f"--test must be one of {', '.join(TESTS)}, got {test!r}")
    if not 0 < alpha < 1:
        raise InputError(f"alpha must lie in (0, 1), got {alpha}")
    matrix, dropped = rank_matrix(results, metric, by, ood, detectors)
    n, k = matrix.shape
    if k < 3:
        raise InputError(f"the Friedman test needs at least 3 detectors with a value in every block; {metric} has {k}")
    if n < 2:
        hint = "; with one model, --by backbone-ood makes each OOD set a block" if by == "backbone" else ""
        raise InputError(f"rank statistics need at least 2 blocks ({by}) where every detector has a value; got {n}"
                         + (f" ({len(dropped)} dropped for a missing detector)" if dropped else "") + hint)  # fmt: skip
    values = matrix.to_numpy(dtype=np.float64)
    signed = values if metric in LOWER_IS_BETTER else -values
    ranks = pd.Series(rankdata(signed, axis=1).mean(axis=0), index=matrix.columns).sort_values(kind="stable")
    statistic, pvalue = friedmanchisquare(*values.T)
    name, correction, _ = TESTS[test]
    with needs():
        import scikit_posthocs as sp

        fn = getattr(sp, name)
        if test == "wilcoxon":
            p = fn(list(values.T), p_adjust=correction)
        elif correction:
            p = fn(pd.DataFrame(values), p_adjust=correction)
        else:
            p = fn(pd.DataFrame(values))
    p = pd.DataFrame(np.asarray(p, dtype=np.float64), index=matrix.columns, columns=matrix.columns)
    cd = float(studentized_range.ppf(1 - alpha, k, np.inf) / np.sqrt(2) * np.sqrt(k * (k + 1) / (6 * n))) if test == "nemenyi" else None
    best = ranks.index[0]
    same = [d for d in ranks.index if d == best or p.loc[best, d] >= alpha]
    return RankResult(metric=metric, by=by, test=test, correction=correction, alpha=alpha, matrix=matrix, ranks=ranks,
                      statistic=float(statistic), pvalue=float(pvalue), pvalues=p.loc[ranks.index, ranks.index], cd=cd,
                      same_as_best=same, dropped=dropped)  # fmt: skip


def cd_diagram(result: RankResult, ax=None, label=str):
    """Draw the CD diagram of ``result`` on ``ax`` (a new figure when None) with scikit-posthocs'
    ``critical_difference_diagram``: average ranks on the axis, a crossbar over each group of
    detectors whose pairwise p-values are all >= alpha, Nemenyi's CD as a bar above when computed.
    ``label`` maps a detector name to its display text. Returns the matplotlib figure (an Agg-canvas
    Figure, no pyplot state, when ``ax`` is None)."""
    with needs():
        import scikit_posthocs as sp
        from matplotlib.figure import Figure

    if ax is None:
        ax = Figure(figsize=(7.0, 0.3 * len(result.ranks) + 1.4)).add_subplot()
    names = {d: label(d) for d in result.ranks.index}
    if len(set(names.values())) < len(names):  # two detectors shown alike: keep the names
        names = {d: d for d in names}
    p = result.pvalues.rename(index=names, columns=names)
    sp.critical_difference_diagram(result.ranks.rename(index=names), p, alpha=result.alpha, ax=ax, cd=result.cd,
                                   label_fmt_left="{label} ({rank:.2f})", label_fmt_right="({rank:.2f}) {label}")  # fmt: skip
    ax.set_title(f"{result.metric}: average rank over {result.n_blocks} blocks ({result.by}), {result.test}", fontsize=9, pad=28)
    return ax.figure
