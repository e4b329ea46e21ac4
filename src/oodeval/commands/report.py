"""``oodeval report RESULTS --out DIR``: the paper's tables and figures and the CnC summary."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import InputError
from ._options import add_convention, add_out

HELP = "write Markdown, LaTeX and one self-contained HTML report (tables with CIs + PNG/PDF/SVG figures) of a results table"
EXAMPLES = [
    "oodeval report results.parquet --out report/",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", type=Path, help="results table (.parquet) written by `oodeval run`")
    add_out(p, "report", folder=True, required=True)
    p.add_argument("--dataset", default=None, help="primary OOD set of Tabs. 1, A1, 2 (default: the first in the table)")
    p.add_argument("--model", default=None, help="model of Tab. 3, A3, A6 and Fig. 1, A4, ROC (default: the supervised model with the best Top-1, as the paper)")
    p.add_argument("--n", type=int, default=None, help="draw size of Tab. A6 (default: the primary set's size, the paper's, capped at half the smallest other OOD set)")
    p.add_argument("--draws", type=int, default=1000, help="sub-sampling draws (default 1000)")
    p.add_argument("--seed", type=int, default=0, help="sub-sampling seed (default 0)")
    p.add_argument("--sweeps", type=Path, default=None, help="vocabulary sweep table (default: <results stem>.sweeps.parquet if present)")
    p.add_argument("--title", default="oodeval report", help="title of the report (default: oodeval report)")
    p.add_argument("--experiment", type=Path, default=None, metavar="EXP", help="experiment file: show only its declared configurations, and its near/far OOD groups (default: every configuration, each labelled)")
    p.add_argument("--gallery", type=Path, default=None, metavar="EXPORT", help="construction export folder (oodeval construct export): its ood.csv images make Fig. 2 / A5")
    add_convention(p)


def run(args: argparse.Namespace) -> int:
    from ..report import write_report

    if args.draws < 2:
        raise InputError(f"--draws must be at least 2 (a std needs two draws), got {args.draws}")
    paths = write_report(
        args.results, args.out, primary=args.dataset, model=args.model, subsample_n=args.n,
        draws=args.draws, seed=args.seed, sweeps=args.sweeps, title=args.title,
        experiment=args.experiment, convention=args.convention, gallery=args.gallery,
    )  # fmt: skip
    for key, path in paths.items():
        print(f"{key:>10}: {path}")
    return 0
