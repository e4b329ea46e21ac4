"""``oodeval score``: fit post-hoc detectors on an ID-train FeatureSet, score ID test and OOD sets."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .._io import check_output, write_csv_atomic
from ..detectors import REGISTRY, canonical, registry_name
from ..detectors.defaults import describe_defaults
from ..errors import InputError
from ..experiment import run_experiment
from ..features import FeatureSet
from ..results import ALL_SPLIT, hp_json, load_results
from ..evaluation import check_request, evaluate_detectors, failures, parse_hyperparameters, supported_names, with_profiles
from ._options import NameList, add_convention, add_defaults, add_detectors, add_out, add_progress
from ._output import add_format, info, write_rows

HELP = "fit post-hoc detectors on ID-train features and report FPR@95 / AUROC per OOD set"
EXAMPLES = [
    "oodeval score --train feats/train --test feats/test --ood ninco=feats/ninco --set knn.k=50 --out scores.csv",
    "oodeval score --train feats/train --test feats/test --ood far=feats/far --detectors msp,energy,vim --set energy.temperature=2",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--train", type=Path, required=True, help="ID-train FeatureSet folder")
    p.add_argument("--test", type=Path, required=True, help="ID-test FeatureSet folder")
    p.add_argument("--nac-train", type=Path, default=None,
                   help="the tapped ID-train rows a detector that fits on its own rows (NAC) fits on, when --train has no NAC "
                        "states (`oodeval extract --nac-fit N`)")  # fmt: skip
    p.add_argument("--ood", nargs="+", action=NameList, required=True, metavar="NAME=DIR",
                   help="OOD FeatureSet folders with their names, space- or comma-separated, repeatable")  # fmt: skip
    add_detectors(p)
    p.add_argument("--set", action="append", default=[], metavar="DETECTOR.PARAM=VALUE",
                   help="override a hyperparameter, e.g. --set knn.k=50 (repeatable)")
    add_defaults(p)  # fmt: skip
    add_out(p, "table", details="A .csv path gets the score table; a .parquet file is a results table in the format of `oodeval run`, which `oodeval report` reads; "
            "rerunning computes only the cells not yet in it")
    p.add_argument("--draws", type=int, default=1000,
                   help="bootstrap resamples for the 95%% intervals in the CSV (OOD resampled, ID fixed; 0: none)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    add_convention(p)
    add_format(p, "the FPR@95 / AUROC rows")
    add_progress(p)


def parse_oods(items: list[str]) -> dict[str, Path]:
    """``["ninco=/x", ...]`` -> ``{"ninco": Path("/x")}``; names must be unique."""
    out: dict[str, Path] = {}
    for item in items:
        name, sep, folder = item.partition("=")
        if not sep or not name or not folder:
            raise InputError(f"--ood {item!r} is not of the form NAME=DIR")
        if name in out:
            raise InputError(f"--ood name {name!r} given twice")
        out[name] = Path(folder)
    return out


def run(args: argparse.Namespace) -> int:
    if args.out is not None and str(args.out) == "-":
        raise InputError("--out - is not a file; give --format csv (or json) to write the rows to stdout")
    parquet = args.out is not None and args.out.suffix == ".parquet"
    if args.out is not None:
        check_output(args.out, "results table" if parquet else "score table")
        if args.out.suffix not in (".csv", ".parquet"):
            raise InputError(f"--out {args.out}: give a .csv (the score table) or a .parquet (a results table) path")
    names, hps = with_profiles(parse_names(args.detectors, canonical_names=False), parse_hyperparameters(args.set), args.defaults)
    check_request(names, hps)  # bad names and values refused before any FeatureSet is read
    train = FeatureSet.load(args.train)
    test = FeatureSet.load(args.test)
    oods = {name: FeatureSet.load(folder) for name, folder in parse_oods(args.ood).items()}
    if parquet:
        if args.nac_train is not None:
            raise InputError("--nac-train works with a .csv output; for a results table, name NAC's fit set in an experiment file")
        return _results_table(args, train, *with_profiles(names or supported_names(train, test, oods), hps, args.defaults))
    tapped = None if args.nac_train is None else FeatureSet.load(args.nac_train)
    rows = evaluate_detectors(train, test, oods, names, hps, progress=not args.no_progress, tapped=tapped,
                              draws=args.draws, seed=args.seed, defaults=args.defaults)  # fmt: skip
    return print_rows(rows, args, train, tapped, "score")


def parse_names(value: list[str] | None, canonical_names: bool = True) -> list[str] | None:
    """``--detectors`` names (:class:`~oodeval.commands._options.NameList`) as oodeval's own (a peer's
    alias resolved, a ``module:Class`` one registered: :func:`oodeval.detectors.registry_name`); None:
    every supported detector. ``canonical_names=False`` keeps a peer's name as given (its profile
    is resolved from it: :func:`oodeval.evaluation.with_profiles`)."""
    if not value:
        return None
    return [canonical(registry_name(n)) if canonical_names else registry_name(n) for n in value]


def print_rows(rows: list[dict], args: argparse.Namespace, train, tapped, command: str) -> int:
    """The end of ``score`` and ``evaluate``: the resolved backbone and profile defaults (of a
    detector that fits on its own rows, for ``tapped`` when given), the rows in ``--format``, the ``--out`` CSV, every failure
    on stderr; exit 1 when any cell failed."""
    import pandas as pd


    if not rows:
        raise InputError("no detector is supported by these FeatureSets")
    log = info(args.format)
    if train.meta.get("random_init"):
        print(f"note: features of {train.meta.get('model')} with RANDOM-INIT weights (--pretrained none): a baseline", file=log)
    ran = list(dict.fromkeys(r["detector"] for r in rows))
    hps = {r["detector"]: json.loads(r.get("hyperparameters") or "{}") for r in rows}  # each one's explicit values and profile
    own = [n for n in ran if tapped is not None and REGISTRY[n].fits_on is not None]
    print("\n".join(describe_defaults([n for n in ran if n not in own], train, hps)), file=log)
    if own:
        print("\n".join(describe_defaults(own, tapped, hps)[1:]), file=log)
    write_rows(rows, args.format, args.convention)
    if getattr(args, "out", None) is not None:
        write_csv_atomic(args.out, pd.DataFrame(rows).to_csv(index=False, lineterminator="\n"), "score table")
        print(f"wrote {args.out}", file=log)
    failed = failures(rows)
    for line in failed:
        print(f"  failed: {line}", file=sys.stderr)
    if failed:
        print(f"oodeval {command}: {len(failed)} of {len(rows)} (detector, OOD set) results failed; the others are above", file=sys.stderr)
    return 1 if failed else 0


def _results_table(args: argparse.Namespace, train, names: list[str], hps: dict) -> int:
    """The same cells through the experiment grid (:func:`oodeval.experiment.run_experiment`) into a
    results table: one model (the FeatureSets' ``meta["model"]``), seed ``--seed``, ``--draws``."""
    if args.draws < 1:
        raise InputError("a results table (.parquet) carries 95% intervals: --draws must be at least 1")
    if not names:
        raise InputError("no detector is supported by these FeatureSets")
    unknown = sorted(set(hps) - set(names))
    if unknown:
        raise InputError(f"--set names detectors that are not scored: {', '.join(unknown)}")
    oods = parse_oods(args.ood)
    label = str(train.meta.get("model") or "features")
    folders = {"id_train": args.train, "id_test": args.test, **oods}
    summary = run_experiment({
        "name": "score", "results": str(args.out.resolve()), "store": str(args.out.resolve().parent / "store"),
        "seeds": [args.seed], "bootstrap_draws": args.draws,
        "datasets": {"id_train": "id_train", "id_test": "id_test", "ood": list(oods)},
        "models": [{"name": label, "features": {role: str(Path(f).resolve()) for role, f in folders.items()}}],
        "detectors": [{"name": n, "hyperparameters": hps.get(n, {})} for n in names],
    }, progress=not args.no_progress)  # fmt: skip
    table = load_results(args.out)
    import numpy as np

    ran = {(n, hp_json(hps.get(n, {}))) for n in names}  # this run's configurations (another profile's are kept apart)
    this = np.array([(d, h) in ran for d, h in zip(table["detector"], table["hyperparameters"])], dtype=bool)
    mine = table[(table["model"] == label) & (table["split"] == ALL_SPLIT) & this & table["dataset"].isin(list(oods))]
    write_rows(mine.rename(columns={"dataset": "ood"}).to_dict("records"), args.format, args.convention)
    print(f"wrote {args.out} ({summary.computed} cells computed, {summary.skipped} already there); "
          f"`oodeval report {args.out} --out DIR` makes the report", file=info(args.format))  # fmt: skip
    for line in summary.errors:
        print(f"  failed: {line}", file=sys.stderr)
    if summary.failed:
        print(f"oodeval score: {summary.failed} of {summary.total} cells failed (recorded in the table); the others are above", file=sys.stderr)
    return 1 if summary.failed else 0
