"""Whether a grid's Slurm jobs are still in the scheduler, on any Slurm, with or without accounting.

submitit learns a job's end from ``sacct``, which needs Slurm's accounting (slurmdbd): without it a
job that leaves the queue with no result (``scancel``, a node lost before it started) is never seen
as done. This watcher asks ``squeue`` (the jobs still queued or running) and, for a job no longer
listed, ``scontrol show job`` (its final state, kept for ``MinJobAge``, 300 s by default) or, with
accounting, ``sacct``. A job that has left the scheduler and has no result file after
``GRACE_SECONDS`` (a shared file system may show a file late) is lost: "did not finish". A failing
``squeue`` (controller unreachable for a while) declares nothing lost. Every call is bounded by
``CALL_TIMEOUT``; ``squeue`` is asked at most every ``POLL_SECONDS``.
"""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Callable, Iterable

__all__ = ["SlurmWatch", "sacct_problem", "slurm_problem"]

log = logging.getLogger(__name__)

#: seconds between two ``squeue`` calls
POLL_SECONDS = 5.0
#: seconds a job that left the scheduler may take to show its result file
GRACE_SECONDS = 20.0
#: seconds any one Slurm command may take
CALL_TIMEOUT = 30.0
#: states in which a job is still the scheduler's (as ``scontrol``/``sacct`` print them)
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
          "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD", "POWER_UP_NODE"}

Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def _call(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=CALL_TIMEOUT, check=False)


def _run(call: Runner, argv: list[str]) -> subprocess.CompletedProcess[str] | None:
    """``call(argv)``, or None when the command is missing or takes longer than ``CALL_TIMEOUT``."""
    try:
        return call(argv)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.debug("%s: %s", argv[0], exc)
        return None


def slurm_problem(call: Runner = _call) -> str | None:
    """Why no Slurm controller answers here (None: one does): ``scontrol ping`` missing, failing, or
    no controller "is UP"."""
    out = _run(call, ["scontrol", "ping"])
    if out is None:
        return "scontrol is not installed (is this a Slurm login node?) or did not answer"
    text = (out.stdout + out.stderr).strip()
    if "is UP" in text:  # the primary (or a backup) controller answers
        return None
    return " ".join(text.split()) or f"scontrol ping exited {out.returncode}"


def sacct_problem(call: Runner = _call) -> str | None:
    """Why ``sacct`` cannot report job states here (None: it can): missing, or accounting disabled
    or unreachable (its own message)."""
    out = _run(call, ["sacct", "--noheader", "--parsable2", "--format=JobID", "--starttime=now"])
    if out is None:
        return "sacct is not installed or did not answer"
    if out.returncode != 0:
        return (out.stderr or out.stdout).strip().splitlines()[-1] if (out.stderr or out.stdout).strip() else f"sacct exited {out.returncode}"
    return None


class SlurmWatch:
    """Tells which of the submitted Slurm jobs are lost: left the scheduler without a result.

    ``call`` runs one Slurm command (``subprocess.run`` with a timeout; tests pass their own) and
    ``clock`` is the time source. Construction probes ``sacct`` once and warns (once) when the job
    states must come from ``squeue``/``scontrol`` alone.
    """

    def __init__(self, call: Runner = _call, clock: Callable[[], float] = time.monotonic) -> None:
        self._call, self._clock = call, clock
        problem = sacct_problem(call)
        self.accounting = problem is None
        if problem is not None:
            log.warning("Slurm accounting (sacct) is unavailable: %s; job states come from squeue and scontrol "
                        "(a job that leaves the queue without a result is 'did not finish' %g s later)", problem, GRACE_SECONDS)
        self._last_poll = float("-inf")
        self._queued: set[str] | None = None  # job ids squeue listed at the last poll
        self._left: dict[str, tuple[float, str]] = {}  # job id -> (when seen gone, its final state)

    def lost(self, job_ids: Iterable[str], has_result: Callable[[str], bool]) -> dict[str, str]:
        """{job id: why} of the jobs among ``job_ids`` (none of them with a result yet when asked)
        that left the scheduler at least ``GRACE_SECONDS`` ago and still have no result."""
        ids = [str(j) for j in job_ids]
        now = self._clock()
        if now - self._last_poll >= POLL_SECONDS:
            self._last_poll = now
            self._queued = self._squeue(ids)
            if self._queued is not None:
                for job_id in ids:
                    if job_id not in self._queued and job_id not in self._left:
                        state = self._final_state(job_id)
                        if state not in ACTIVE:
                            self._left[job_id] = (now, state)
                    elif job_id in self._queued:
                        self._left.pop(job_id, None)  # listed again (requeued)
        out = {}
        for job_id in ids:
            if job_id in self._left and now - self._left[job_id][0] >= GRACE_SECONDS and not has_result(job_id):
                out[job_id] = f"left the Slurm queue without a result (state {self._left[job_id][1]})"
        return out

    def _squeue(self, ids: list[str]) -> set[str] | None:
        """The ids among ``ids`` that squeue lists (None: squeue failed, nothing can be concluded)."""
        if not ids:
            return set()
        out = _run(self._call, ["squeue", "--noheader", "--format=%i", f"--jobs={','.join(ids)}"])
        if out is None:
            return None
        if out.returncode != 0:
            # Slurm answers "Invalid job id specified" (exit 1) when no id it was asked about is known any more
            return set() if "invalid job id" in (out.stderr + out.stdout).lower() else None
        return {line.strip() for line in out.stdout.splitlines() if line.strip()}

    def _final_state(self, job_id: str) -> str:
        """The state of a job squeue no longer lists: from scontrol (while Slurm keeps it), else sacct
        (with accounting), else "unknown (purged)"."""
        out = _run(self._call, ["scontrol", "--oneliner", "show", "job", job_id])
        if out is not None and out.returncode == 0:
            for field in out.stdout.split():
                if field.startswith("JobState="):
                    return field.split("=", 1)[1]
        if self.accounting:
            out = _run(self._call, ["sacct", "--noheader", "--parsable2", "--allocations", "--format=State", f"--jobs={job_id}"])
            if out is not None and out.returncode == 0 and out.stdout.strip():
                return out.stdout.split()[0]
        return "unknown (purged)"
