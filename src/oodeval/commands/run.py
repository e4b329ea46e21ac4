"""``oodeval run EXPERIMENT``: the models x detectors x datasets grid into one results table."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "run (or resume) an experiment grid from a TOML/YAML file into one Parquet results table"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("experiment", type=Path, help="experiment file (.toml, .yaml or .yml); see docs/experiments.md")
    p.add_argument("--check", action="store_true", help="validate the file and print the grid, compute nothing")
    p.add_argument("--report", type=Path, default=None, metavar="DIR", help="also write the report into DIR afterwards")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def run(args: argparse.Namespace) -> int:
    from ..experiment import load_config, run_experiment
    from ..experiment.zeroshot import vocabulary_label

    cfg = load_config(args.experiment)
    if args.check:
        seeds = ", ".join(map(str, cfg.seeds))
        print(f"experiment {cfg.name!r}: {len(cfg.models)} model(s), {len(cfg.ood)} OOD set(s), seeds {seeds}")
        for m in cfg.models:
            dets = cfg.detectors_for(m)
            names = ", ".join(d.display + (f"[{vocabulary_label(d.vocabulary)}]" if d.vocabulary else "") for d in dets) if dets else "every supported detector"
            extras = [x for x, on in (("taps", m.taps), ("patch features", m.patch_features)) if on]
            print(f"  {m.label} ({m.kind}{', ' + ', '.join(extras) if extras else ''}): {names}")
        print(f"  ID train {cfg.id_train.label if cfg.id_train else '-'}, ID test {cfg.id_test.label}; OOD: {', '.join(d.label for d in cfg.ood)}")
        print(f"  results -> {cfg.results}")
        return 0
    summary = run_experiment(cfg, progress=not args.no_progress)
    print(summary)
    for err in summary.errors[:10]:
        print(f"  failed: {err}")
    if len(summary.errors) > 10:
        print(f"  ... and {len(summary.errors) - 10} more failed cells (status == 'error' in the table)")
    if args.report is not None:
        from ..report import write_report

        paths = write_report(summary.results, args.report, experiment=cfg)
        print(f"report: {paths['html']}")
    return 0
