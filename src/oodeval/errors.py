"""The errors oodeval raises for the user's input, files or environment (not for its own bugs).

Every such error is an :class:`OodevalError`; each subclass also derives from the built-in
exception callers caught before this module existed, so ``except ValueError`` (or ``KeyError``,
``RuntimeError``) keeps working. The CLI (:mod:`oodeval.cli`) prints them as
``oodeval CMD: error: ...`` and exits 2, as it does for OS errors (a missing, unreadable or
misplaced file, a full disk, an unreachable endpoint) and for running out of memory; a compute
cluster that cannot be reached (:class:`ClusterUnreachableError`) exits 3; any other exception is a
bug in oodeval and exits 1.
"""

from __future__ import annotations

__all__ = ["OodevalError", "InputError", "UnknownNameError", "StateError", "ClusterUnreachableError", "is_user_error"]


class OodevalError(Exception):
    """Base of every error that is the user's to fix (bad input, a refused path, a missing entry)."""


class InputError(OodevalError, ValueError):
    """A value, file content, option or configuration that oodeval refuses, saying what and why."""


class UnknownNameError(OodevalError, KeyError):
    """A name (detector, scorer, dataset, suite, label) that is not registered or not present."""

    def __str__(self) -> str:  # KeyError quotes its message; this one reads as a sentence
        return str(self.args[0]) if self.args else ""


class StateError(OodevalError, RuntimeError):
    """Work that cannot proceed from the state on disk or in memory (an incomplete store entry,
    features a run lacks, a detector scored before ``fit``)."""


class ClusterUnreachableError(RuntimeError):
    """The compute cluster a command was sent to (a Ray cluster, a Slurm controller) cannot be reached
    or refused the connection; raised before anything was written. Not the input's fault: the CLI
    exits 3 for it."""


def is_user_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the user's to fix: an :class:`OodevalError`, an ``OSError`` (a file, a disk,
    a network endpoint), running out of memory (host or GPU)."""
    if isinstance(exc, (OodevalError, OSError, MemoryError)):
        return True
    return type(exc).__name__ == "OutOfMemoryError"  # torch.cuda.OutOfMemoryError, without importing torch
