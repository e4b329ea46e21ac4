"""``oodeval rank RESULTS --metric fpr95 --by backbone``: Friedman test, average ranks and pairwise
post-hoc p-values of the detectors of a results table (:mod:`oodeval.ranking`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ._output import add_format, write_rows

HELP = "rank the detectors of a results table: Friedman test, average ranks, pairwise post-hoc tests (oodeval report draws the CD diagram)"
EXAMPLES = [
    "oodeval rank results.parquet --metric fpr95 --by backbone",
    "oodeval rank results.parquet --metric auroc --by backbone-ood --test wilcoxon --format csv",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..ranking import BLOCKS, TESTS

    p.add_argument("results", type=Path, help="results table (.parquet) written by `oodeval run` or `score --out`")
    p.add_argument("--metric", default="fpr95", help="metric column to rank by (default fpr95; lower-is-better metrics are ranked ascending)")
    p.add_argument("--by", choices=tuple(BLOCKS), default="backbone",
                   help="blocks: backbone (one per model, its OOD sets averaged) or backbone-ood (one per model x OOD set)")  # fmt: skip
    p.add_argument("--test", choices=tuple(TESTS), default="nemenyi",
                   help="post-hoc test: nemenyi (Demšar 2006), conover (Holm) or wilcoxon (Holm)")  # fmt: skip
    p.add_argument("--alpha", type=float, default=0.05, help="significance level (default 0.05)")
    p.add_argument("--ood", action="append", default=None, metavar="SET", help="OOD set(s) to use (repeatable; default all)")
    add_format(p, "the ranks")


def format_ranks(result) -> str:
    """The text table: the test line, average ranks (best first, * where no test separates a
    detector from the best) and the pairwise p-value matrix."""
    lines = [result.describe()]
    if result.dropped:
        lines.append(f"model / OOD set pairs dropped (a detector has no value there): {', '.join(result.dropped)}")
    lines.append("")
    lines.append("average rank (1 = best; * = not significantly different from the best)")
    for det, r in result.ranks.items():
        lines.append(f"  {det:<28} {r:6.3f}{'  *' if det in result.same_as_best else ''}")
    lines.append("")
    lines.append(f"pairwise p-values ({result.test}{', ' + result.correction + '-corrected' if result.correction else ''})")
    lines.append(result.pvalues.map(lambda v: f"{v:.4f}").to_string())
    return "\n".join(lines)


def rank_rows(result) -> list[dict]:
    """One row per detector (best first): its average rank, whether it is in the best's group, the
    test's statistics and its p-value against every other detector (``p_<detector>``)."""
    return [{"detector": det, "average_rank": float(r), "same_as_best": det in result.same_as_best, "metric": result.metric,
             "by": result.by, "n_blocks": result.n_blocks, "friedman_statistic": result.statistic,
             "friedman_pvalue": result.pvalue, "test": result.test, "correction": result.correction, "alpha": result.alpha,
             "cd": result.cd, **{f"p_{o}": float(result.pvalues.loc[det, o]) for o in result.pvalues.columns}}
            for det, r in result.ranks.items()]  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from ..ranking import rank_detectors
    from ..results import load_results

    result = rank_detectors(load_results(args.results), args.metric, args.by, args.test, args.alpha, args.ood)
    if args.format == "table":
        print(format_ranks(result))
    else:
        write_rows(rank_rows(result), args.format)
    return 0
