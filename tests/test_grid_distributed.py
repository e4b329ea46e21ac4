"""Results parts with concurrent writers, and the grid as submitit local jobs and as Ray tasks
(one killed)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from pathlib import Path

import cloudpickle
import numpy as np
import pandas as pd
import pytest
import ray.cloudpickle
from test_grid_run import config, make_sets

from oodeval import cli
from oodeval.experiment import run_experiment, runner
from oodeval.results import KEY, compact_results, load_results, parts_dir, write_part

# the features functions below run inside submitit's and Ray's worker processes
cloudpickle.register_pickle_by_value(sys.modules[__name__])
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: columns that legitimately differ between two runs of the same grid
VOLATILE = ["seconds", "fit_seconds", "score_seconds", "created"]


def _rows(writer: int, n: int) -> pd.DataFrame:
    return pd.DataFrame(
        {"model": f"m{writer}", "weights": "", "detector": "msp", "hyperparameters": "{}",
         "dataset": [f"d{i}" for i in range(n)], "split": "all", "seed": 0, "status": "ok", "fpr95": 0.5}
    )  # fmt: skip


def _writer(path: str, writer: int, parts: int) -> None:
    for i in range(parts):
        write_part(_rows(writer, 3).assign(dataset=lambda d, i=i: d["dataset"] + f"-{i}"), path)


def test_concurrent_part_writers_and_compaction_lose_nothing(tmp_path):
    path = tmp_path / "results.parquet"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(path), w, 15)) for w in range(4)]
    for p in procs:
        p.start()
    while any(p.is_alive() for p in procs):
        compact_results(path)  # folds parts in while the writers are still adding new ones
        load_results(path)
    for p in procs:
        p.join()
        assert p.exitcode == 0
    assert len(load_results(path)) == 4 * 15 * 3  # merged on read, parts or not
    compact_results(path)
    assert list(parts_dir(path).glob("part-*")) == []
    df = pd.read_parquet(path)  # one plain Parquet file after compaction
    assert len(df) == 180 and not df.duplicated(list(KEY)).any()


def _table(path) -> pd.DataFrame:
    df = load_results(path).drop(columns=VOLATILE)
    return df.sort_values(list(KEY)).reset_index(drop=True)


class _KillOnRead(np.ndarray):
    """Logits whose first chunk read SIGKILLs the process (once, across processes: the marker
    file named by OODEVAL_TEST_KILL), like a node lost while a detector scores a dataset."""

    def __getitem__(self, item):
        marker = os.environ.get("OODEVAL_TEST_KILL")
        if marker:
            try:  # created exclusively: of two workers reading at once, only one dies
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
                os.kill(os.getpid(), signal.SIGKILL)
        return np.asarray(self)[item]


def killing_features(model, weights, ds, role, cfg):
    """The normal features; the 'far' OOD set's logits kill the job that scores them first."""
    fs = runner.extract_experiment_features(model, weights, ds, role, cfg)
    if role == "far":
        fs.logits = fs.logits.view(_KillOnRead)
    return fs


#: per executor: the options of the first run (which loses a worker) and of the rerun
EXECUTOR_OPTIONS = {
    "local": ({"max_jobs": 2, "timeout_min": 10}, {"max_jobs": 2}),
    "ray": ({"max_jobs": 2}, {"max_jobs": 2}),  # a local Ray instance of 2 CPUs, started per run
}


@pytest.mark.parametrize("executor", ["local", "ray"])
def test_jobs_equal_inprocess_and_survive_a_killed_worker(tmp_path, monkeypatch, executor):
    paths = make_sets(tmp_path)
    dets = ["msp", "energy", "mahalanobis", {"name": "knn", "hyperparameters": {"k": 5}}]
    ref = run_experiment(config(tmp_path / "ref", paths, detectors=dets), progress=False)
    cfg = config(tmp_path / "dist", paths, detectors=dets)
    marker = tmp_path / "killed"
    monkeypatch.setenv("OODEVAL_TEST_KILL", str(marker))
    first_options, rerun_options = EXECUTOR_OPTIONS[executor]
    first = run_experiment(
        cfg, progress=False, features=killing_features, executor=executor, executor_options=first_options,
    )  # fmt: skip
    assert marker.exists()  # one worker really died, after scoring ID test and 'near', inside a 'far' cell
    assert len(first.lost) == 1 and "did not finish" in first.lost[0] and not first.errors  # a lost job, no failed cell
    partial = load_results(cfg["results"])
    assert 0 < len(partial) < len(load_results(ref.results))
    # every cell of the killed job: its whole OOD sets and the split cells the other detectors have
    cells = load_results(ref.results)
    missing = set(cells[list(KEY)].itertuples(index=False, name=None)) - set(partial[list(KEY)].itertuples(index=False, name=None))
    assert first.not_computed == len(missing) > 0 and not first.ok
    # the rerun fans out only the missing work; the killed job's cells are computed now
    monkeypatch.delenv("OODEVAL_TEST_KILL")
    second = run_experiment(cfg, progress=False, executor=executor, executor_options=rerun_options)
    assert second.skipped == len(partial) and second.computed == ref.total - len(partial)
    assert not second.errors
    pd.testing.assert_frame_equal(_table(cfg["results"]), _table(ref.results))
    assert list(parts_dir(cfg["results"]).glob("part-*")) == []


def test_cli_executor_options_are_checked(tmp_path, capsys):
    paths = make_sets(tmp_path)
    cfg = config(tmp_path, paths, detectors=["msp"])
    exp = tmp_path / "exp.toml"
    exp.write_text(_toml(cfg))
    assert cli.main(["run", str(exp), "--executor-option", "timeout_min=5", "--no-progress"]) == 2
    assert "needs --executor local, slurm or ray" in capsys.readouterr().err
    assert cli.main(["run", str(exp), "--executor", "local", "--executor-option", "oops", "--no-progress"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    for bad, message in (("num_gpus=one", "num_gpus"), ("nodes=2", "Invalid option keyword nodes")):
        assert cli.main(["run", str(exp), "--executor", "ray", "--executor-option", bad, "--no-progress"]) == 2
        assert message in capsys.readouterr().err
    assert not Path(cfg["results"]).exists()


def _toml(cfg: dict) -> str:
    import json

    models = cfg["models"][0]
    feats = ", ".join(f"{k} = {json.dumps(v)}" for k, v in models["features"].items())
    return f"""
seeds = {json.dumps(cfg["seeds"])}
bootstrap_draws = {cfg["bootstrap_draws"]}
results = {json.dumps(cfg["results"])}
detectors = {json.dumps(cfg["detectors"])}

[datasets]
id_train = "train"
id_test = "test"
ood = ["near", {{ name = "far", split_column = "fine_grained" }}]

[[models]]
name = "synthetic"
features = {{ {feats} }}
"""
