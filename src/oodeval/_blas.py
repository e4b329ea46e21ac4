"""The process-wide BLAS thread setting, held to one thread while each core runs its own block's
products (the detectors' row blocks, AdaNeg's batch blocks; see docs/performance.md)."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator

__all__ = ["controller", "one_blas_thread"]

_BLAS: dict = {}


def controller():
    """The BLAS libraries loaded (threadpoolctl), numpy's among them: the one that runs the blocks'
    products. Looked up again only once a module was imported since the last look (a library
    loads with a module; a look-up scans every loaded library, see docs/performance.md)."""
    from threadpoolctl import ThreadpoolController

    if _BLAS.get("modules") != len(sys.modules):
        _BLAS.update(controller=ThreadpoolController().select(user_api="blas"), modules=len(sys.modules))
    return _BLAS["controller"]


_HOLDS: dict = {"count": 0, "limiter": None, "threads": 1}
_HOLDS_LOCK = threading.Lock()


@contextlib.contextmanager
def one_blas_thread() -> Iterator[int]:
    """A context holding BLAS to one thread, for per-core blocks (the detectors'
    :meth:`Compute.by_rows`, AdaNeg's batches) and for a short product before a detector's
    passes. BLAS's setting is process-wide, so holds from several threads nest: the first sets one thread, the last restores the setting
    that was in force before the first (a user's ``threadpool_limits`` included). Yields the
    largest BLAS thread count of that setting (the most threads a caller should occupy)."""
    with _HOLDS_LOCK:
        if _HOLDS["count"] == 0:
            blas = controller()
            _HOLDS["threads"] = max([lib["num_threads"] for lib in blas.info()], default=os.cpu_count() or 1)
            _HOLDS["limiter"] = blas.limit(limits=1)
        _HOLDS["count"] += 1
        threads = _HOLDS["threads"]
    try:
        yield threads
    finally:
        with _HOLDS_LOCK:
            _HOLDS["count"] -= 1
            if _HOLDS["count"] == 0:
                _HOLDS["limiter"].restore_original_limits()
                _HOLDS["limiter"] = None
