"""The grid's entry point: :func:`run_experiment` checks the experiment's outputs, then runs its
units in this process (:func:`oodeval.experiment.runner.run_units`) or fans them out
(:func:`oodeval.experiment.executors.run_distributed`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from .._io import check_output, claim_folder
from ..errors import InputError
from ..results import PARTS_KIND, parts_dir
from .config import ExperimentConfig, load_config
from .executors import run_distributed
from .runner import EXECUTORS, FeatureFn, RunSummary, extract_experiment_features, run_units, scores_dir

__all__ = ["run_experiment"]


def run_experiment(
    config: str | Path | dict | ExperimentConfig,
    *,
    progress: bool = True,
    features: FeatureFn | None = None,
    executor: str = "inprocess",
    executor_options: dict | None = None,
) -> RunSummary:
    """Run (or resume) the grid of ``config`` and return a :class:`RunSummary`; ``.results`` is
    the Parquet table's path. ``features`` replaces the FeatureSet source (default:
    :func:`extract_experiment_features`). ``executor``: "inprocess" (default), or "local" / "slurm" to fan
    the work out as submitit jobs with ``executor_options`` passed to ``update_parameters``, or
    "ray" for Ray tasks (see :mod:`oodeval.experiment.executors`)."""
    cfg = replace(load_config(config), progress=progress)
    features = features or extract_experiment_features
    if executor not in EXECUTORS:
        raise InputError(f"executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    check_output(cfg.results, "results table")  # refused before any work
    if cfg.results.suffix != ".parquet":
        raise InputError(f"results = {str(cfg.results)!r}: the results table is Parquet, so its path must end in .parquet")

    def claim() -> None:
        claim_folder(scores_dir(cfg.results), "run scores")
        claim_folder(parts_dir(cfg.results), PARTS_KIND)

    if executor != "inprocess":  # the folders are claimed once the cluster is reached
        return run_distributed(cfg, executor, executor_options or {}, features, progress, prepare=claim)
    claim()
    return run_units(cfg, features, progress=progress)
