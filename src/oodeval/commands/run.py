"""``oodeval run EXPERIMENT``: the models x detectors x datasets grid into one results table."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from .. import detectors
from .._io import check_output
from ..detectors.defaults import describe_defaults
from ..errors import InputError
from ..experiment import load_config, run_experiment
from ..experiment.check import check_experiment, eoe_prompt_notes
from ..experiment.disk import describe_disk, estimate_disk
from ..experiment.zeroshot import compact_generations, vocabulary_generation, vocabulary_label
from ..results import ALL_SPLIT, load_results
from ._options import add_convention, add_defaults, add_full_image_hash, add_progress
from ._output import FORMATS, write_rows

HELP = "run (or resume) an experiment grid from a TOML/YAML file into one Parquet results table"
EXAMPLES = [
    "oodeval run examples/experiment.toml --check",
    "oodeval run examples/experiment.toml --report report/",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("experiment", type=Path, help="experiment file (.toml, .yaml or .yml); see docs/experiments.md")
    p.add_argument("--check", action="store_true",
                   help="validate the file and everything checkable offline (datasets, weights, model names, vocabularies), print the grid, compute nothing")  # fmt: skip
    p.add_argument("--names-only", action="store_true",
                   help="with --check: verify model names and print resolved defaults only, before checkpoints and data are in place")
    p.add_argument("--report", type=Path, default=None, metavar="DIR", help="also write the report into DIR afterwards (default: none)")
    p.add_argument("--format", choices=FORMATS, default=None,
                   help="also write this experiment's cells (whole OOD sets) to stdout: table (FPR@95 / AUROC per detector "
                   "and OOD set), csv or json (every column; the summary then goes to stderr); default: the summary line only")
    add_defaults(p, "; overrides the experiment's top-level `defaults`")
    add_convention(p)
    add_progress(p)
    p.add_argument(
        "--executor",
        choices=("inprocess", "local", "slurm", "ray"),
        default="inprocess",
        help="where the work runs: this process (default), submitit jobs on this machine or on Slurm, "
        "or Ray tasks (a local Ray instance, or the cluster named by --executor-option address=...)",
    )
    p.add_argument(
        "--executor-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a submitit parameter for --executor local/slurm (e.g. slurm_partition=gpu, timeout_min=600, "
        "gpus_per_node=1, max_jobs=50), or for --executor ray a task option or the cluster (num_gpus=1, "
        "max_retries=2, address=auto, max_jobs=8); repeatable",
    )
    add_full_image_hash(p)  # or full_image_hash = true in the experiment file


def executor_options(pairs: list[str]) -> dict:
    """``KEY=VALUE`` strings as a dict; values parsed as JSON where they are (numbers, true), else text."""
    import json

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InputError(f"--executor-option expects KEY=VALUE, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    jobs = out.get("max_jobs")
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise InputError(f"--executor-option max_jobs must be an integer >= 1, got {jobs!r}")
    return out


def run(args: argparse.Namespace) -> int:
    """Exit 0 when every cell succeeded, 1 when any failed or was not computed (a job did not finish;
    after printing the summary), 2 on a bad file, 3 when the cluster cannot be reached."""
    cfg = load_config(args.experiment, defaults=args.defaults)
    if args.full_image_hash:
        cfg = dataclasses.replace(cfg, full_image_hash=True)
    if args.check:
        return _check(cfg, args.names_only)
    if args.names_only:
        raise InputError("--names-only applies to --check")
    options = executor_options(args.executor_option)
    if options and args.executor == "inprocess":
        raise InputError("--executor-option needs --executor local, slurm or ray")
    if args.report is not None:
        check_output(args.report, "report", folder=True)  # refused before any work
    summary = run_experiment(cfg, progress=not args.no_progress, executor=args.executor, executor_options=options)
    log = sys.stderr if args.format in ("csv", "json") else sys.stdout
    print(summary, file=log)
    if args.format is not None:
        rows = summary_rows(cfg, summary.results)
        write_rows(display_rows(rows) if args.format == "table" else rows, args.format, args.convention)
    if args.report is not None:
        from ..report import write_report

        paths = write_report(summary.results, args.report, experiment=cfg, convention=args.convention)
        print(f"report: {paths['html']}", file=log)
    if summary.ok:
        return 0
    print(f"oodeval run: {closing_line(summary, log)}; `oodeval run --check {args.experiment}` lists missing inputs, -v shows tracebacks",
          file=sys.stderr)  # fmt: skip
    return 1


def closing_line(summary, log=sys.stderr) -> str:
    """What went wrong in a run, each kind counted as what it is: failed cells (recorded with their
    error), cells not computed and the jobs that did not finish (a rerun computes those cells), failed
    sweeps; the details first, one line each, to ``log``."""
    if summary.failed_kept:
        print(f"  {summary.failed_kept} cell(s) failed in an earlier run and were kept (retry_failed = false)", file=log)
    for message, (n, first) in summary.error_counts.items():
        print(f"  {n} failed, e.g. {first}: {message}", file=log)
    for job in summary.lost:
        print(f"  {job}", file=log)
    what = []
    failed = summary.failed + summary.failed_kept
    if failed:
        what.append(f"{failed} of {summary.total} cell(s) failed (each error is in the 'error' column of the rows "
                    f"with status == 'error' in {summary.results})")
    if summary.not_computed or summary.runs_not_computed:
        runs = f" (and every cell of {summary.runs_not_computed} model run(s))" if summary.runs_not_computed else ""
        what.append(f"{summary.not_computed} of {summary.total} cell(s){runs} not computed")
    if summary.lost:
        what.append(f"{len(summary.lost)} job(s) did not finish (a rerun computes only what they left)")
    if summary.sweeps_failed:
        what.append(f"{summary.sweeps_failed} sweep(s) failed (above)")
    return "; ".join(what)


def summary_rows(cfg, results) -> list[dict]:
    """The cells of ``cfg`` over whole OOD sets in its results table, ``dataset`` named ``ood``."""
    df = load_results(results)
    mine = (df["model"].isin([m.label for m in cfg.models]) & df["dataset"].isin([d.label for d in cfg.ood])
            & df["seed"].isin(list(cfg.seeds)) & (df["split"] == ALL_SPLIT))  # fmt: skip
    return df[mine].rename(columns={"dataset": "ood"}).to_dict("records")


def display_rows(rows: list[dict]) -> list[dict]:
    """``rows`` with ``detector`` made unique per (model, configuration, seed) for the text table:
    the model, the detector label, its hyperparameters where one model ran several, the seed where
    there are several; ``zs:`` before a zero-shot scorer that a post-hoc detector shown shares a name with."""
    import pandas as pd

    from ..report.views import mark_zero_shot

    if not rows:
        return rows
    df = pd.DataFrame(rows)
    label = mark_zero_shot(df["label"].fillna(df["detector"]).astype(str), df["kind"])
    parts = [df["model"].astype(str) + " / "] if df["model"].nunique() > 1 else []
    parts.append(label)
    if (df.assign(_l=label).groupby(["model", "_l"])["hyperparameters"].nunique() > 1).any():
        parts.append(" " + df["hyperparameters"].astype(str))
    if df["seed"].nunique() > 1:
        parts.append(" seed " + df["seed"].astype(str))
    shown = parts[0]
    for p in parts[1:]:
        shown = shown + p
    return df.assign(detector=shown).to_dict("records")


def _check(cfg, names_only: bool = False) -> int:
    from ..features.taps import nac_plan

    seeds = ", ".join(map(str, cfg.seeds))
    print(f"experiment {cfg.name!r}: {len(cfg.models)} model(s), {len(cfg.ood)} OOD set(s), seeds {seeds}")
    for m in cfg.models:
        dets = cfg.detectors_for(m)
        names = ", ".join(_listing(dets)) if dets else "every supported detector"
        extras = [x for x, on in (("taps", m.taps), ("GL-MCM patch readouts", m.patch_features),
                                  ("full patch features", m.full_patch_features)) if on] + [f"{s.kind} pass" for s in m.passes]
        print(f"  {m.label} ({m.kind}{', ' + ', '.join(extras) if extras else ''}): {names}")
        print(f"    weights: {_weights_text(m)}")
        if m.kind == "supervised":  # the backbone-dependent defaults each detector will run with
            listed = [d.name for d in dets] if dets else detectors.names()
            explicit = {d.name: d.hyperparameters for d in dets or ()}
            source = {"model": m.name}
            if m.taps and any(n in detectors.REGISTRY and detectors.REGISTRY[n].fits_on is not None for n in listed):  # the layers extraction will tap
                source.update(nac_plan(m.name, m.model_kwargs) or {})
            for line in describe_defaults(listed, source, explicit):
                print(f"    {line.strip()}")
    print(f"  ID train {cfg.id_train.label if cfg.id_train else '-'}, ID test {cfg.id_test.label}; OOD: {', '.join(d.label for d in cfg.ood)}")
    print(f"  results -> {cfg.results}")
    notes, prompt_problems = eoe_prompt_notes(cfg)
    for note in notes:
        print(f"  note: {note}")
    disk = None
    if not names_only:
        disk = estimate_disk(cfg)
        for row in disk:
            print(describe_disk(row))
    problems = check_experiment(cfg, names_only, disk) + prompt_problems
    if problems:
        raise InputError(f"{len(problems)} problem(s) before this experiment can run:\n" + "\n".join(f"  - {p}" for p in problems))
    print("check passed: every model name resolves" if names_only else
          "check passed: datasets, weights, model names and vocabularies are all in place")
    random = [m.label for m in cfg.models if m.random_init]
    if random:
        print(f"note: {', '.join(random)} extract with RANDOM weights (pretrained = false): a baseline, not a trained model")
    return 0


def _weights_text(m) -> str:
    """Where a model's weights come from, as ``run --check`` states it."""
    if m.ensemble:
        return f"its members' (a deep ensemble of {', '.join(m.ensemble)}; each member's weights files)"
    if m.weights != (None,):
        return ", ".join(dict.fromkeys(str(w) for w in m.weights))
    if m.pretrained:
        return "the hub weights the name names (pretrained = true; downloaded at extraction, needs network)"
    if m.pretrained is False:
        return "RANDOM INIT (pretrained = false), seed 0"
    return "none needed (every set has a precomputed FeatureSet)"


def _listing(dets) -> list[str]:
    """Detector names with their vocabularies, the generations of one vocabulary shown once
    (``eoe[EOE-gen{0..29}]``)."""
    groups: dict[tuple, list[str]] = {}
    for d in dets:
        label = vocabulary_label(d.vocabulary) if d.vocabulary else None
        base = None if label is None else vocabulary_generation(label)[0]
        groups.setdefault((d.display, base, label if base == label else None), []).append(label)
    return [name if base is None else f"{name}[{', '.join(compact_generations(labels))}]" for (name, base, _), labels in groups.items()]
