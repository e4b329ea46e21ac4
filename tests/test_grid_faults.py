"""The grid's fault paths without a real cluster: Slurm's squeue/scontrol/sacct are small scripts on
PATH and submitit's executor a fake that runs each job in this process (or loses it); a Ray cluster
that cannot be reached. Also the store's extraction lock and the coordinator's store look-ups."""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_grid_e2e import make_data

from oodeval import cli
from oodeval.experiment import executors, runner, slurm_watch
from oodeval.experiment.slurm_watch import SlurmWatch
from oodeval.features import store
from oodeval.results import KEY, load_results

# ---------------------------------------------------------------------------- a fake Slurm
SCRIPTS = {
    # squeue lists the ids in $FAKE_SLURM/queue that it was asked about
    "squeue": """#!/bin/sh
for a in "$@"; do case "$a" in --jobs=*) ids="${a#--jobs=}";; esac; done
[ -f "$FAKE_SLURM/squeue-fails" ] && { echo "squeue: error: slurm_load_jobs error: Unable to contact slurm controller" >&2; exit 1; }
found=0
for id in $(echo "$ids" | tr ',' ' '); do grep -qx "$id" "$FAKE_SLURM/queue" 2>/dev/null && { echo "$id"; found=1; }; done
[ $found = 0 ] && { echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; }
exit 0
""",
    "scontrol": """#!/bin/sh
if [ "$1" = ping ]; then cat "$FAKE_SLURM/ping"; exit 0; fi
id="$4"
[ -f "$FAKE_SLURM/state-$id" ] && { echo "JobId=$id JobName=oodeval JobState=$(cat "$FAKE_SLURM/state-$id") Reason=None"; exit 0; }
echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1
""",
    "sacct": """#!/bin/sh
echo "sacct: error: Slurm accounting storage is disabled" >&2; exit 1
""",
}


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """A Slurm without accounting whose commands read the folder $FAKE_SLURM; short waits."""
    folder = tmp_path / "fake-slurm"
    (folder / "bin").mkdir(parents=True)
    for name, text in SCRIPTS.items():
        (folder / "bin" / name).write_text(text)
        (folder / "bin" / name).chmod(0o755)
    (folder / "ping").write_text("Slurmctld(primary) at localhost is UP\n")
    (folder / "queue").write_text("")
    monkeypatch.setenv("PATH", f"{folder / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM", str(folder))
    monkeypatch.setattr(slurm_watch, "POLL_SECONDS", 0.05)
    monkeypatch.setattr(slurm_watch, "GRACE_SECONDS", 0.3)
    monkeypatch.setattr(executors, "POLL_SECONDS", 0.02)
    return folder


class _Job:
    def __init__(self, job_id: str, folder: Path, finished: bool, result=None) -> None:
        self.job_id = job_id
        self.paths = SimpleNamespace(result_pickle=folder / f"{job_id}_result.pkl")
        self._result = result
        if finished:
            self.paths.result_pickle.write_text("done")

    def done(self) -> bool:  # what submitit's job answers from sacct: never, without accounting
        return False

    def result(self):
        return self._result


class FakeExecutor:
    """submitit's executor as the coordinator sees it: each job runs at once in this process, except
    the ones ``lose(what)`` picks: those are "scancel"led (no result, gone from the queue)."""

    def __init__(self, folder: Path, lose=lambda fn, args: False) -> None:
        self.folder, self.lose, self.submitted = folder, lose, []
        folder.mkdir(parents=True, exist_ok=True)

    def submit(self, fn, *args):
        job_id = str(1000 + len(self.submitted))
        self.submitted.append((fn.__name__, args))
        if self.lose(fn, args):
            (Path(os.environ["FAKE_SLURM"]) / f"state-{job_id}").write_text("CANCELLED")
            return _Job(job_id, self.folder, False)
        return _Job(job_id, self.folder, True, fn(*args))


def tiny_grid(root: Path, name: str = "exp", detectors: tuple[str, ...] = ("msp", "energy"), **top: str) -> Path:
    """``<root>/<name>.toml``: random-init timm test_resnet extracted into the store, on the image
    folders of ``test_grid_e2e.make_data`` under ``<root>/data``, one seed, 2 OOD sets (one with a
    split column); ``top``: more top-level string settings (``store``, ``results``)."""
    settings = "".join(f'{k} = "{v}"\n' for k, v in top.items())
    dets = "".join(f'[[detectors]]\nname = "{d}"\n' for d in detectors)
    exp = root / f"{name}.toml"
    exp.write_text(f"""seeds = [0]
bootstrap_draws = 20
batch_size = 16
device = "cpu"
{settings}[datasets]
id_train = "data/train"
id_test = "data/val"
ood = ["data/gray", {{ name = "data/fi", label = "Fi", split_column = "fine_grained" }}]
[[models]]
name = "timm:test_resnet"
label = "r"
pretrained = false
model_kwargs = {{ num_classes = 3 }}
{dets}""")
    return exp


def _grid(tmp_path) -> Path:
    make_data(tmp_path / "data")
    return tiny_grid(tmp_path)


def _use(monkeypatch, ex: FakeExecutor) -> None:
    monkeypatch.setattr(executors, "_executor", lambda kind, folder, options: ex)


def _table(path) -> list:
    df = load_results(path).drop(columns=["seconds", "fit_seconds", "score_seconds", "created", "scores_id", "scores_ood"])
    return df.sort_values(list(KEY)).reset_index(drop=True)


def test_cancelled_job_without_accounting_is_reported_and_rerun_submits_only_missing_work(tmp_path, fake_slurm, monkeypatch, capsys):
    exp = _grid(tmp_path)
    energy = lambda fn, args: fn.__name__ == "_units_job" and args[2][0].detector == "energy"  # noqa: E731
    first = FakeExecutor(tmp_path / "jobs1", lose=energy)
    _use(monkeypatch, first)
    started = time.monotonic()
    assert cli.main(["run", str(exp), "--executor", "slurm", "--no-progress"]) == 1
    assert time.monotonic() - started < 120  # bounded: the lost job does not hang the run
    out, err = capsys.readouterr()
    kinds = [name for name, _ in first.submitted]
    assert kinds.count("_extract_job") == 4 and kinds.count("_units_job") == 2  # id_train, id_test, 2 OOD sets; 2 detectors
    # the warning, once; the lost job listed as what it is; energy's 2 OOD sets and the 2 splits of Fi not computed
    assert err.count("Slurm accounting (sacct) is unavailable") == 1 and "storage is disabled" in err
    assert "job r/energy (1005): did not finish: left the Slurm queue without a result (state CANCELLED)" in out + err
    assert "oodeval run: 4 of 8 cell(s) not computed; 1 job(s) did not finish" in err
    assert "cell(s) failed" not in err and "sweep" not in err and "(0 failed), 4 not computed" in out
    assert set(load_results(tmp_path / "results.parquet")["detector"]) == {"msp"}

    # the rerun: no extraction (every entry is in the store), one job, the lost detector's
    second = FakeExecutor(tmp_path / "jobs2")
    _use(monkeypatch, second)
    assert cli.main(["run", str(exp), "--executor", "slurm", "--no-progress"]) == 0
    assert [(name, args[2][0].detector) for name, args in second.submitted] == [("_units_job", "energy")]
    capsys.readouterr()

    # a no-op rerun submits no job at all
    third = FakeExecutor(tmp_path / "jobs3")
    _use(monkeypatch, third)
    assert cli.main(["run", str(exp), "--executor", "slurm", "--no-progress"]) == 0
    assert third.submitted == [] and "0 computed (0 failed)" in capsys.readouterr().out

    # the same cells as a run in one process (same code, same inputs, same process: equal)
    ref = tmp_path / "ref.toml"
    ref.write_text(exp.read_text().replace('device = "cpu"', 'device = "cpu"\nresults = "ref.parquet"'))
    assert cli.main(["run", str(ref), "--no-progress"]) == 0
    import pandas as pd

    pd.testing.assert_frame_equal(_table(tmp_path / "results.parquet"), _table(tmp_path / "ref.parquet"))


def test_unreachable_clusters_exit_3_and_leave_nothing(tmp_path, fake_slurm, monkeypatch, capsys):
    exp = _grid(tmp_path)
    (fake_slurm / "ping").write_text("Slurmctld(primary) at localhost is DOWN\n")
    assert cli.main(["run", str(exp), "--executor", "slurm", "--no-progress"]) == 3
    assert "Slurm controller cannot be reached: Slurmctld(primary) at localhost is DOWN" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "exp.toml", "fake-slurm"]

    import ray

    def refuse(**kwargs):
        raise ConnectionError("Unauthenticated: token authentication is enabled on the cluster")

    monkeypatch.setattr(ray, "init", refuse)
    assert cli.main(["run", str(exp), "--executor", "ray", "--executor-option", "address=127.0.0.1:6390", "--no-progress"]) == 3
    err = capsys.readouterr().err
    assert "cannot start or reach the Ray cluster at 127.0.0.1:6390" in err and "RAY_AUTH_MODE=token" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "exp.toml", "fake-slurm"]


# ---------------------------------------------------------------------------- the watcher alone
class FakeSlurm:
    """``call`` for :class:`SlurmWatch`: answers from ``queue`` (ids) and ``states`` (scontrol)."""

    def __init__(self, sacct_ok: bool = False) -> None:
        self.queue: set[str] = set()
        self.states: dict[str, str] = {}
        self.squeue_fails = False
        self.sacct_ok = sacct_ok
        self.calls: list[list[str]] = []

    def __call__(self, argv):
        self.calls.append(argv)
        done = lambda rc, out="", err="": subprocess.CompletedProcess(argv, rc, out, err)  # noqa: E731
        if argv[0] == "sacct":
            return done(0, "CANCELLED by 0\n") if self.sacct_ok else done(1, err="sacct: error: Slurm accounting storage is disabled\n")
        if argv[0] == "squeue":
            if self.squeue_fails:
                return done(1, err="slurm_load_jobs error: Unable to contact slurm controller\n")
            ids = argv[-1].split("=", 1)[1].split(",")
            listed = [i for i in ids if i in self.queue]
            return done(0, "".join(f"{i}\n" for i in listed)) if listed else done(1, err="slurm_load_jobs error: Invalid job id specified\n")
        if argv[0] == "scontrol":
            job = argv[-1]
            return done(0, f"JobId={job} JobState={self.states[job]} Reason=None\n") if job in self.states else done(1, err="Invalid job id specified\n")
        raise AssertionError(argv)


def test_watch_declares_a_job_lost_only_after_it_left_the_queue_and_the_grace(monkeypatch, caplog):
    monkeypatch.setattr(slurm_watch, "POLL_SECONDS", 1.0)
    monkeypatch.setattr(slurm_watch, "GRACE_SECONDS", 10.0)
    slurm, now = FakeSlurm(), [0.0]
    with caplog.at_level(logging.WARNING, logger="oodeval"):
        watch = SlurmWatch(call=slurm, clock=lambda: now[0])
    assert not watch.accounting and sum("sacct) is unavailable" in r.message for r in caplog.records) == 1
    slurm.queue = {"7", "8"}
    no_result = lambda job_id: False  # noqa: E731
    assert watch.lost(["7", "8"], no_result) == {}
    slurm.queue = {"8"}
    slurm.states["7"] = "CANCELLED"
    now[0] = 2.0
    assert watch.lost(["7", "8"], no_result) == {}  # gone, but within the grace a result file may still show
    now[0] = 11.9
    assert watch.lost(["7", "8"], no_result) == {}
    now[0] = 12.1
    assert watch.lost(["7", "8"], no_result) == {"7": "left the Slurm queue without a result (state CANCELLED)"}
    assert watch.lost(["7"], lambda job_id: True) == {}  # its result showed up: not lost
    # a controller that does not answer declares nothing lost, however long
    slurm.queue, slurm.squeue_fails = set(), True
    now[0] = 100.0
    assert watch.lost(["8"], no_result) == {}
    now[0] = 200.0
    assert watch.lost(["8"], no_result) == {}
    # purged from scontrol (MinJobAge passed) and no accounting: still lost, state unknown
    slurm.squeue_fails = False
    now[0] = 300.0
    watch.lost(["8"], no_result)
    now[0] = 311.0
    assert watch.lost(["8"], no_result) == {"8": "left the Slurm queue without a result (state unknown (purged))"}


def test_watch_keeps_a_job_scontrol_still_sees_running_and_uses_sacct_with_accounting(monkeypatch, caplog):
    monkeypatch.setattr(slurm_watch, "POLL_SECONDS", 0.0)
    monkeypatch.setattr(slurm_watch, "GRACE_SECONDS", 0.0)
    slurm = FakeSlurm(sacct_ok=True)
    with caplog.at_level(logging.WARNING, logger="oodeval"):
        watch = SlurmWatch(call=slurm, clock=lambda: 0.0)
    assert watch.accounting and not caplog.records
    slurm.states["5"] = "COMPLETING"  # between squeue and scontrol: not gone
    assert watch.lost(["5"], lambda job_id: False) == {}
    del slurm.states["5"]  # purged from the controller; accounting knows the state
    assert watch.lost(["5"], lambda job_id: False) == {"5": "left the Slurm queue without a result (state CANCELLED)"}
    # a missing squeue is no conclusion either
    watch._call = lambda argv: (_ for _ in ()).throw(FileNotFoundError(argv[0]))
    assert watch.lost(["6"], lambda job_id: False) == {}


# ---------------------------------------------------------------------------- the store's lock
def test_entry_lock_lets_one_holder_at_a_time_and_leaves_nothing(tmp_path):
    order, inside = [], threading.Event()

    def first():
        with store.entry_lock(tmp_path, "k" * 64):
            inside.set()
            order.append("first in")
            time.sleep(0.3)
            order.append("first out")

    def second():
        inside.wait(5)
        with store.entry_lock(tmp_path, "k" * 64):
            order.append("second in")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert order == ["first in", "first out", "second in"]
    assert list(tmp_path.iterdir()) == []  # the lock file and .partial are removed


def test_extract_cached_only_finds_an_entry_without_creating_anything(tmp_path):
    from oodeval.features.extract import extract

    make_data(tmp_path / "data")
    kw = {"pretrained": False, "model_kwargs": {"num_classes": 3}, "device": "cpu", "progress": False}
    st = tmp_path / "store"
    assert extract("timm:test_resnet", tmp_path / "data" / "gray", st, cached_only=True, **kw) is None
    assert not st.exists() or not any(st.rglob("*.npz"))
    path = extract("timm:test_resnet", tmp_path / "data" / "gray", st, **kw)
    assert extract("timm:test_resnet", tmp_path / "data" / "gray", st, cached_only=True, **kw) == path
    assert not (st / ".partial").exists()  # lock and partial folder gone once the entry is in


# ---------------------------------------------------------------------------- the closing line
def test_closing_line_counts_each_kind_as_what_it_is(tmp_path):
    import io

    from oodeval.commands.run import closing_line
    from oodeval.experiment.runner import RunSummary

    s = RunSummary(results=tmp_path / "r.parquet", total=10, computed=6, failed=2, not_computed=4)
    s.add_error("m/msp/near/all/seed 0", "boom")
    s.add_error("m/msp/near/all/seed 1", "boom")
    s.add_error("sweep size m/near", "bad vocabulary", sweep=True)
    s.lost.append("job m/energy (7): did not finish: left the Slurm queue without a result (state CANCELLED)")
    details = io.StringIO()
    parts = closing_line(s, details).split("; ")
    assert parts[0].startswith("2 of 10 cell(s) failed (each error is in the 'error' column")
    assert parts[1:] == ["4 of 10 cell(s) not computed", "1 job(s) did not finish (a rerun computes only what they left)",
                         "1 sweep(s) failed (above)"]  # fmt: skip
    assert "  2 failed, e.g. m/msp/near/all/seed 0: boom" in details.getvalue() and "(state CANCELLED)" in details.getvalue()
    assert not s.ok and "6 computed (2 failed), 4 not computed" in str(s)
    # only a lost job: no cell counted as failed, no sweep
    lost = RunSummary(results=tmp_path / "r.parquet", total=8, computed=8, lost=["job x (1): did not finish: killed"])
    assert closing_line(lost, io.StringIO()) == "1 job(s) did not finish (a rerun computes only what they left)"
