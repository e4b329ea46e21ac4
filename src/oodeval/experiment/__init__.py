"""The models x detectors x datasets grid: a validated experiment file, a resumable
runner that appends to one Parquet results table, and the per-cell score files the reports read.

    from oodeval.experiment import run_experiment
    summary = run_experiment("experiment.toml")   # summary.results: the Parquet table's path
"""

from .config import DetectorSpec, ExperimentConfig, ExperimentDataset, ModelSpec, load_config
from .grid import run_experiment
from .runner import RunSummary, extract_experiment_features, scores_dir

__all__ = [
    "ExperimentConfig", "ModelSpec", "DetectorSpec", "ExperimentDataset", "load_config",
    "run_experiment", "RunSummary", "extract_experiment_features", "scores_dir",
]  # fmt: skip
