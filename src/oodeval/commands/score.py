"""``oodeval score``: fit post-hoc detectors on an ID-train FeatureSet, score ID test and OOD sets."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "fit post-hoc detectors on ID-train features and report FPR@95 / AUROC per OOD set"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--train", type=Path, required=True, help="ID-train FeatureSet folder")
    p.add_argument("--test", type=Path, required=True, help="ID-test FeatureSet folder")
    p.add_argument("--nac-train", type=Path, default=None,
                   help="the FeatureSet NAC fits on, when --train has no NAC states (`oodeval extract --nac-fit N`)")  # fmt: skip
    p.add_argument("--ood", action="append", required=True, metavar="NAME=DIR",
                   help="an OOD FeatureSet folder with its name (repeatable)")  # fmt: skip
    p.add_argument("--detectors", default=None,
                   help="comma-separated detector names (default: every detector the data supports)")  # fmt: skip
    p.add_argument("--set", action="append", default=[], metavar="DETECTOR.PARAM=VALUE",
                   help="override a hyperparameter, e.g. --set knn.k=50 (repeatable)")  # fmt: skip
    p.add_argument("--out", type=Path, default=None, help="write the table as CSV here (an existing file only if it is an earlier score table)")
    p.add_argument("--draws", type=int, default=1000,
                   help="bootstrap resamples for the 95%% intervals in the CSV (OOD resampled, ID fixed; 0: none)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def parse_oods(items: list[str]) -> dict[str, Path]:
    """``["ninco=/x", ...]`` -> ``{"ninco": Path("/x")}``; names must be unique."""
    out: dict[str, Path] = {}
    for item in items:
        name, sep, folder = item.partition("=")
        if not sep or not name or not folder:
            raise ValueError(f"--ood {item!r} is not of the form NAME=DIR")
        if name in out:
            raise ValueError(f"--ood name {name!r} given twice")
        out[name] = Path(folder)
    return out


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    from .._io import atomic_path, check_output, csv_header_starts
    from ..detectors.defaults import describe
    from ..features import FeatureSet
    from ..scoring import add_intervals, evaluate_detectors, failures, format_table, parse_hyperparameters

    is_score_table = csv_header_starts("detector", "ood")
    if args.out is not None:
        check_output(args.out, "score table", is_own=is_score_table)
    names = [n.strip() for n in args.detectors.split(",") if n.strip()] if args.detectors else None
    hps = parse_hyperparameters(args.set)
    train = FeatureSet.load(args.train)
    test = FeatureSet.load(args.test)
    oods = {name: FeatureSet.load(folder) for name, folder in parse_oods(args.ood).items()}
    fit_sets = {} if args.nac_train is None else {"nac": FeatureSet.load(args.nac_train)}
    scores: dict = {}
    rows = evaluate_detectors(train, test, oods, names, hps, scores_out=scores, progress=not args.no_progress,
                              fit_sets=fit_sets)  # fmt: skip
    if not rows:
        raise ValueError("no detector is supported by these FeatureSets")
    rows = add_intervals(rows, scores, draws=args.draws, seed=args.seed)
    ran = list(dict.fromkeys(r["detector"] for r in rows))
    print("\n".join(describe([n for n in ran if n not in fit_sets], train, hps)))
    for name, fs in fit_sets.items():
        if name in ran:
            print("\n".join(describe([name], fs, hps)[1:]))
    print(format_table(rows))
    if args.out is not None:
        with atomic_path(args.out, "score table", is_score_table) as tmp:
            pd.DataFrame(rows).to_csv(tmp, index=False)
        print(f"wrote {args.out}")
    failed = failures(rows)
    for line in failed:
        print(f"  failed: {line}", file=sys.stderr)
    if failed:
        print(f"oodeval score: {len(failed)} of {len(rows)} (detector, OOD set) results failed; the others are above", file=sys.stderr)
    return 1 if failed else 0
