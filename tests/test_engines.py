"""The grid on real engines (scripts/engines.sh): a Ray cluster of two nodes and a single-node Slurm
with accounting, all on 127.0.0.1. Each runs a small grid (random-init timm test_resnet extracted on
the cluster, 2 detectors x 2 OOD sets) equal to a serial run with one thread, loses a job on the way
(a Ray worker SIGKILLed, a Slurm job scancelled, with and without accounting), reports it, and
reruns only the missing cells; a no-op rerun submits nothing. `.ci/run` runs these after `make test`
with OODEVAL_ENGINES=ray,slurm; elsewhere they are skipped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import numpy as np
import pandas as pd
import pytest
import ray.cloudpickle
from test_grid_e2e import make_data
from test_grid_faults import tiny_grid

from oodeval.commands.run import closing_line
from oodeval.experiment import executors, run_experiment, runner
from oodeval.results import KEY, load_cell_scores, load_results

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the features functions below run in the jobs
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

ENGINES_DIR = Path(os.environ.get("ENGINES_DIR", "/tmp/oodeval-engines"))
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "engines.sh"
#: columns that differ between two runs of the same cells (times, and score paths under another stem)
VOLATILE = ["seconds", "fit_seconds", "score_seconds", "created", "scores_id", "scores_ood"]


def _experiment(root: Path, name: str) -> Path:
    return tiny_grid(root, name, ("msp", "mahalanobis"), store=f"{name}-store", results=f"{name}.parquet")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The data, and the grid run serially in one process with one thread (as Ray's and these Slurm
    jobs run); shared by the tests."""
    root = tmp_path_factory.mktemp("engines")
    make_data(root / "data")
    exp = _experiment(root, "serial")
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    subprocess.run([sys.executable, "-m", "oodeval", "run", str(exp), "--no-progress"], cwd=root, env=env, check=True, timeout=300)
    return root / "serial.parquet"


def _assert_same_cells(results: Path, reference: Path) -> None:
    """Every cell and every score array equal to the reference, bit for bit: same code, same
    inputs, one thread in both (see docs/experiments.md on thread counts)."""
    a, b = (load_results(p).sort_values(list(KEY)).reset_index(drop=True) for p in (results, reference))
    pd.testing.assert_frame_equal(a.drop(columns=VOLATILE), b.drop(columns=VOLATILE))
    for (_, ra), (_, rb) in zip(a[a["status"] == "ok"].iterrows(), b[b["status"] == "ok"].iterrows()):
        for x, y in zip(load_cell_scores(ra, results), load_cell_scores(rb, reference)):
            assert np.array_equal(x, y)


class _Dying(np.ndarray):
    """Logits whose first read in a job (once: the marker file) ends that job the way ``how`` says."""

    marker: str = ""
    how: str = ""

    def __getitem__(self, item):
        if self.marker and not Path(self.marker).exists():
            Path(self.marker).write_text(str(os.getpid()))
            if self.how == "kill":  # a Ray worker lost
                os.kill(os.getpid(), signal.SIGKILL)
            else:  # scancel of this very job; it then ignores SIGTERM (as submitit's jobs do) until KillWait
                subprocess.run(["scancel", os.environ["SLURM_JOB_ID"]], check=True)
                time.sleep(120)
        return np.asarray(self)[item]


def dying_features(marker: str, how: str):
    """The normal features, except that the 'Fi' logits end the job that scores them first."""

    def features(model, weights, ds, role, cfg):
        fs = runner.extract_experiment_features(model, weights, ds, role, cfg)
        if role == "Fi":
            fs.logits = fs.logits.view(_Dying)
            fs.logits.marker, fs.logits.how = marker, how
        return fs

    return features


@pytest.fixture
def submissions(monkeypatch):
    """The calls each stage of the coordinator submitted, as lists of job names."""
    seen: list[list[str]] = []
    real = executors._run_jobs

    def spy(ex, calls, *args, **kwargs):
        calls = list(calls)
        seen.append([what for what, _, _ in calls])
        return real(ex, calls, *args, **kwargs)

    monkeypatch.setattr(executors, "_run_jobs", spy)
    return seen


def _jobs(seen: list[list[str]]) -> list[str]:
    out = [what for stage in seen for what in stage]
    seen.clear()
    return out


@pytest.mark.engines("ray")
def test_ray_cluster_equals_serial_reports_a_killed_worker_and_reruns_only_it(tmp_path, monkeypatch, submissions, reference):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").symlink_to(reference.parent / "data")
    exp = _experiment(tmp_path, "ray")
    options = {"address": (ENGINES_DIR / "ray.address").read_text().strip()}
    features = dying_features(str(tmp_path / "killed"), "kill")
    first = run_experiment(exp, progress=False, executor="ray", executor_options=options, features=features)
    assert (tmp_path / "killed").exists() and len(first.lost) == 1 and "did not finish" in first.lost[0]
    assert not first.errors and not first.ok and first.not_computed == 4  # the killed detector's 2 OOD sets, 2 splits of Fi
    line = closing_line(first)
    assert line.startswith("4 of 8 cell(s) not computed; 1 job(s) did not finish") and "failed" not in line
    assert sorted(_jobs(submissions)) == ["extract r/Fi", "extract r/gray", "extract r/id_test", "extract r/id_train",
                                          "r/mahalanobis", "r/msp"]  # fmt: skip

    second = run_experiment(exp, progress=False, executor="ray", executor_options=options)
    assert second.ok and second.computed > 0
    assert _jobs(submissions) in (["r/mahalanobis"], ["r/msp"])  # only the lost job's unit, no extraction
    third = run_experiment(exp, progress=False, executor="ray", executor_options=options)
    assert third.ok and third.computed == 0 and _jobs(submissions) == []  # a no-op rerun submits nothing
    _assert_same_cells(tmp_path / "ray.parquet", reference)


def _engines(*args: str) -> None:
    subprocess.run(["bash", str(SCRIPT), *args], check=True, timeout=120)


@pytest.mark.engines("slurm")
def test_slurm_equals_serial_reports_cancelled_jobs_with_and_without_accounting(tmp_path, monkeypatch, submissions, caplog, reference):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the jobs inherit the submitting environment
    (tmp_path / "data").symlink_to(reference.parent / "data")
    exp = _experiment(tmp_path, "slurm")
    options = {"slurm_partition": "ci", "cpus_per_task": 1, "timeout_min": 10}

    # with accounting: the cancelled job is seen (by scontrol; sacct works) and reported
    started = time.monotonic()
    first = run_experiment(exp, progress=False, executor="slurm", executor_options=options,
                           features=dying_features(str(tmp_path / "cancel-1"), "scancel"))  # fmt: skip
    assert (tmp_path / "cancel-1").exists() and len(first.lost) == 1 and "state CANCELLED" in first.lost[0]
    assert not first.errors and not first.ok and first.not_computed == 4 and time.monotonic() - started < 240
    assert closing_line(first).startswith("4 of 8 cell(s) not computed; 1 job(s) did not finish")
    assert "sacct) is unavailable" not in caplog.text
    assert len(_jobs(submissions)) == 6
    lost = first.lost[0].split()[1]  # "r/msp" or "r/mahalanobis"

    # without accounting (slurmdbd stopped): warned once, the cancelled job still seen within bounded time
    _engines("stop", "slurmdbd")
    try:
        started = time.monotonic()
        second = run_experiment(exp, progress=False, executor="slurm", executor_options=options,
                                features=dying_features(str(tmp_path / "cancel-2"), "scancel"))  # fmt: skip
        assert len(second.lost) == 1 and "state CANCELLED" in second.lost[0] and time.monotonic() - started < 240
        assert not second.ok and closing_line(second).startswith("4 of 8 cell(s) not computed; 1 job(s) did not finish")
        assert caplog.text.count("sacct) is unavailable") == 1
        assert _jobs(submissions) == [lost]  # the rerun resubmits only the missing unit
    finally:
        _engines("start", "slurmdbd")

    third = run_experiment(exp, progress=False, executor="slurm", executor_options=options)
    assert third.ok and _jobs(submissions) == [lost]
    fourth = run_experiment(exp, progress=False, executor="slurm", executor_options=options)
    assert fourth.ok and fourth.computed == 0 and _jobs(submissions) == []  # a no-op rerun submits no job
    _assert_same_cells(tmp_path / "slurm.parquet", reference)
