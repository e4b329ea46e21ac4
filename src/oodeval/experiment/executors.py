"""The grid as jobs: ``oodeval run EXP --executor local|slurm`` (submitit) or ``--executor ray``.

Two stages, each a set of independent jobs: (1) feature extraction per (model run, dataset)
whose features come from the store (precomputed folders need none); (2) one job per (model
run, detector) where the experiment lists its detectors, else per model run: it loads the
cached features, fits the detector once and evaluates its missing cells (``run_units``). Every
job writes its rows as its own results part (``oodeval.results.write_part``), so jobs on any
number of nodes write concurrently and nothing is lost; the coordinator folds the parts into
the main table when the jobs are done. A job that dies (killed, out of memory, time limit,
cancelled) leaves its cells missing, is listed in the summary (``lost``, with the cells it left
``not_computed``), and a rerun computes only those cells. Which units are pending is decided from
the table and the FeatureSets' recorded hashes alone (``runner.pending_units``): a rerun of a
finished grid submits no job. On Slurm, a job that leaves the queue without a result is seen
within bounded time with or without accounting (:mod:`oodeval.experiment.slurm_watch`).

``executor_options`` go to submitit's ``update_parameters`` (e.g. ``timeout_min``,
``slurm_partition``, ``cpus_per_task``, ``gpus_per_node``, ``mem_gb``), except ``max_jobs``:
the most jobs in flight at once (default: the CPU count for "local" and "ray", unlimited for
"slurm"). Job logs and pickles live in ``<results stem>.jobs/`` beside the table.

With "ray" each job is a Ray task. ``address`` names a running cluster (``ray start --head``
on its head node, then ``address=auto`` or ``address=HOST:6379``, or ``RAY_ADDRESS`` set;
``max_jobs`` is then unlimited by default); without it a local Ray instance with ``max_jobs``
CPUs is started for the run and stopped after it (a Ray instance this process already started
is used as it is); a cluster that cannot be reached is a :class:`~oodeval.errors.ClusterUnreachableError`
raised before any output exists (so is a Slurm controller that does not answer ``scontrol ping``).
The other options
go to the tasks' ``.options`` (``num_cpus`` (default 1), ``num_gpus``, ``memory``,
``resources``, ``max_retries``). ``max_retries`` defaults to 0: a task whose worker dies is
listed like a dead submitit job, and the rerun computes its cells (Ray's own default, 3, would
retry it in place).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import SimpleNamespace

from .._extras import optional
from ..errors import ClusterUnreachableError, InputError
from ..results import ALL_SPLIT, KEY, _key_of, compact_results, load_results
from .config import ExperimentConfig, code_on_path
from .runner import RunSummary, Unit, _failed_kept, _recorded_hash, pending_units, run_units, unit_cells
from .slurm_watch import SlurmWatch, slurm_problem

__all__ = ["run_distributed", "jobs_dir"]

log = logging.getLogger(__name__)

#: seconds between polls of the jobs in flight
POLL_SECONDS = 0.5


def jobs_dir(results: Path) -> Path:
    """The folder of submitit's job logs and pickles, beside the results table."""
    return results.parent / f"{results.stem}.jobs"


def _extract_job(cfg: ExperimentConfig, features, label: str, weights: str, role: str) -> None:
    code_on_path(cfg.code_dir)  # a worker process does not share the coordinator's sys.path
    model = next(m for m in cfg.models if m.label == label)
    ds = cfg.id_test if role == "id_test" else cfg.id_train if role == "id_train" else next(d for d in cfg.ood if d.label == role)
    features(model, weights or None, ds, role, cfg)


def _units_job(cfg: ExperimentConfig, features, units: list[Unit]) -> RunSummary:
    code_on_path(cfg.code_dir)
    return run_units(cfg, features, units, progress=False, compact=False, sweeps=False)


def _extractions(cfg: ExperimentConfig, units: list[Unit]) -> list[tuple[str, str, str]]:
    """(model label, weights, role) of every dataset a pending unit reads from the store and that
    is not in the store yet (looked up by its key, nothing loaded)."""
    missing: dict[tuple[str, str, str], bool] = {}
    models = {m.label: m for m in cfg.models}
    sets = {"id_test": cfg.id_test, "id_train": cfg.id_train, **{d.label: d for d in cfg.ood}}
    for unit in units:
        label, weights, model = unit.model, unit.weights, models[unit.model]
        roles = ["id_test"] + [d.label for d in cfg.ood]
        if model.kind == "supervised" and cfg.id_train is not None:
            roles.insert(0, "id_train")
        for role in roles:
            if role not in model.features and (label, weights, role) not in missing:
                missing[(label, weights, role)] = _recorded_hash(model, weights or None, role, sets[role], cfg) is None
    return [key for key, todo in missing.items() if todo]


def _executor(kind: str, folder: Path, options: dict):
    ex = optional("submitit").AutoExecutor(folder=folder, cluster="local" if kind == "local" else "slurm")
    params = {"name": "oodeval"}
    params.update(options)
    try:
        ex.update_parameters(**params)
    except (AssertionError, NameError, TypeError, ValueError) as exc:  # submitit checks names and types with these
        raise InputError(f"--executor {kind}: {exc}") from None
    return ex


class _RayJob:
    """A Ray task seen as a submitit job (``done``, ``result``, ``job_id``)."""

    def __init__(self, ref) -> None:
        self.ref = ref
        self.job_id = ref.hex()[:16]

    def done(self) -> bool:
        return bool(optional("ray").wait([self.ref], timeout=0)[0])

    def result(self):
        return optional("ray").get(self.ref)


@contextlib.contextmanager
def _ray_executor(options: dict, cpus: int):
    """An object whose ``submit(fn, *args)`` runs fn as a Ray task, connected to ``address``
    or to a local instance of ``cpus`` CPUs started here and stopped on leaving; the task
    options are checked before anything runs."""
    ray = optional("ray")

    options = dict(options)
    address = options.pop("address", None)
    task = {"num_cpus": 1, "max_retries": 0, **options}
    try:
        ray.remote(_extract_job).options(**task)  # an unknown or malformed option raises here
    except (TypeError, ValueError) as exc:
        raise InputError(f"--executor ray: {exc}") from None
    started = not ray.is_initialized()
    if started:
        cluster = address or os.environ.get("RAY_ADDRESS")
        kw = {} if cluster else {"num_cpus": cpus, "include_dashboard": False}
        try:
            ray.init(address=address, log_to_driver=False, configure_logging=False, **kw)
        except Exception as exc:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ... for an unreachable cluster
            where = f"the Ray cluster at {cluster}" if cluster else "a local Ray instance"
            hint = ("; a cluster started with token authentication (Ray >= 2.5x, ~/.ray/auth_token) needs RAY_AUTH_MODE=token"
                    " in this process's environment too" if "auth" in str(exc).lower() else "")
            raise ClusterUnreachableError(f"--executor ray: cannot start or reach {where}: {type(exc).__name__}: "
                                          f"{str(exc)[:500]}{hint}; nothing ran") from None
    remote = functools.cache(lambda fn: ray.remote(fn).options(**task))  # one per job kind
    try:
        yield SimpleNamespace(submit=lambda fn, *args: _RayJob(remote(fn).remote(*args)))
    finally:
        if started:
            ray.shutdown()


def _run_jobs(ex, calls: Iterable[tuple[str, Callable, tuple]], max_jobs: int | None, summary: RunSummary,
              watch: SlurmWatch | None = None) -> tuple[list, list[tuple]]:
    """Submit ``(what, fn, args)`` calls with at most ``max_jobs`` in flight; return the results of
    those that finished and the ``args`` of those that did not (each listed in ``summary.lost``).
    With ``watch`` (Slurm) a job is finished when its result file exists, and lost when it left the
    scheduler without one (:class:`SlurmWatch`); otherwise the job itself says when it is done."""
    queue, running, results, lost = list(calls), [], [], []

    def did_not_finish(what: str, job, why: str, args: tuple) -> None:
        summary.lost.append(f"job {what} ({job.job_id}): did not finish: {why}")
        lost.append(args)

    while queue or running:
        while queue and (max_jobs is None or len(running) < max_jobs):
            what, fn, args = queue.pop(0)
            running.append((what, ex.submit(fn, *args), args))
        still = []
        for what, job, args in running:
            if not (job.paths.result_pickle.exists() if watch is not None else job.done()):
                still.append((what, job, args))
                continue
            try:
                results.append(job.result())
            except Exception as exc:  # noqa: BLE001 - a dead job: its cells stay missing, a rerun does them
                log.debug("job %s failed", what, exc_info=True)
                did_not_finish(what, job, f"{type(exc).__name__}: {str(exc)[:500]}", args)
        if watch is not None and still:
            by_id = {str(job.job_id): (what, job, args) for what, job, args in still}
            gone = watch.lost(by_id, lambda job_id: by_id[job_id][1].paths.result_pickle.exists())
            for job_id, why in gone.items():
                did_not_finish(*by_id[job_id][:2], why, by_id[job_id][2])
            still = [entry for entry in still if str(entry[1].job_id) not in gone]
        running = still
        if running:
            time.sleep(POLL_SECONDS)
    return results, lost


def run_distributed(cfg: ExperimentConfig, kind: str, options: dict, features, progress: bool,
                    prepare: Callable[[], None] = lambda: None) -> RunSummary:
    """Run the pending units of ``cfg`` as jobs of ``kind``: submitit's "local" or "slurm", or
    Ray tasks ("ray"). ``prepare`` (creating the outputs) runs once the cluster is reached, so an
    unreachable one (:class:`~oodeval.errors.ClusterUnreachableError`) leaves nothing behind."""
    options = dict(options)
    on_cluster = kind == "slurm" or (kind == "ray" and ("address" in options or "RAY_ADDRESS" in os.environ))
    max_jobs = options.pop("max_jobs", None if on_cluster else os.cpu_count() or 1)
    if kind == "ray":
        with _ray_executor(options, max_jobs or os.cpu_count() or 1) as ex:
            prepare()
            return _run_all(cfg, ex, max_jobs, features, progress)
    watch = None
    if kind == "slurm":
        problem = slurm_problem()
        if problem is not None:
            raise ClusterUnreachableError(f"--executor slurm: the Slurm controller cannot be reached: {problem}; nothing ran")
        watch = SlurmWatch()
    ex = _executor(kind, jobs_dir(cfg.results), options)
    prepare()
    return _run_all(cfg, ex, max_jobs, features, progress, watch)


def _run_all(cfg: ExperimentConfig, ex, max_jobs: int | None, features, progress: bool, watch: SlurmWatch | None = None) -> RunSummary:
    """The two stages of jobs on ``ex``, then the parts folded into the table."""
    summary = RunSummary(results=cfg.results)
    units, settled = pending_units(cfg)
    summary.total = summary.skipped = settled
    extractions = _extractions(cfg, units)
    if extractions:
        calls = [(f"extract {m}/{r}", _extract_job, (cfg, features, m, w, r)) for m, w, r in extractions]
        _run_jobs(ex, calls, max_jobs, summary, watch)  # a lost one is extracted by the first job that needs it
    calls = [(f"{u.model}/{u.detector or '*'}", _units_job, (cfg, features, [u])) for u in units]
    parts, lost = _run_jobs(ex, calls, max_jobs, summary, watch)
    for part in parts:
        _absorb(summary, part)
    compact_results(cfg.results)
    _count_not_computed(cfg, [u for _, _, units in lost for u in units], summary)
    if cfg.sweeps:
        sweep = run_units(cfg, features, [], progress=progress, sweeps=True)
        summary.failed_kept = sweep.failed_kept
        _absorb(summary, sweep)
    elif not cfg.retry_failed:
        summary.failed_kept = _failed_kept(load_results(cfg.results), cfg)
    return summary


def _count_not_computed(cfg: ExperimentConfig, units: list[Unit], summary: RunSummary) -> None:
    """Add the cells of the lost jobs' ``units`` that are not in the table to ``summary.not_computed``
    (and to its total): each whole OOD set, plus the split cells other detectors of the same model
    run have on it; units of unknown size (their detectors not listed) to ``runs_not_computed``."""
    if not units:
        return
    table = load_results(cfg.results)
    present = {_key_of(r) for r in table[list(KEY)].itertuples(index=False, name=None)} if len(table) else set()
    splits: dict[tuple, set[str]] = {}
    for key in present:
        if key.split != ALL_SPLIT:
            splits.setdefault((key.model, key.weights, key.dataset, key.seed), set()).add(key.split)
    for unit in units:
        cells = unit_cells(cfg, unit)
        if cells is None:
            summary.runs_not_computed += 1
            continue
        missing = sum(1 + len(splits.get((c.model, c.weights, c.dataset, c.seed), ())) for c in cells if c not in present)
        summary.not_computed += missing
        summary.total += missing


def _absorb(summary: RunSummary, part: RunSummary) -> None:
    """Add a job's counts and errors to the coordinator's summary."""
    summary.total += part.total
    summary.skipped += part.skipped
    summary.computed += part.computed
    summary.failed += part.failed
    summary.fits += part.fits
    summary.errors += part.errors
    summary.sweeps_failed += part.sweeps_failed
    summary.lost += part.lost
    for message, (n, first) in part.error_counts.items():
        total, first_seen = summary.error_counts.get(message, (0, first))
        summary.error_counts[message] = (total + n, first_seen)
