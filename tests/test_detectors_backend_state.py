"""The compute backend leaves the user's process as it found it: after a detector's fit and score
(numpy and torch cpu paths) BLAS's thread settings are those before the call, the threads that
ran the row blocks have ended, and a user's own ``threadpool_limits`` both bounds the blocks'
threads and is what the call restores."""

import threading

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from oodeval import detectors
from oodeval.detectors._backend import PARALLEL_ROWS, Compute
from oodeval.detectors._synthetic import synthetic_problem

BLOCKS = 12


@pytest.fixture(scope="module")
def problem():
    # 1500 rows: three blocks of PARALLEL_ROWS, so the numpy backend runs them on several threads
    return synthetic_problem(n_classes=6, dim=16, n_train=1500, n_test=1500, n_ood=10, seed=3, nac=False)


def blas_threads() -> list[int]:
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


def traced_blocks(comp: Compute) -> tuple[np.ndarray, list[tuple[threading.Thread, list[int]]]]:
    """by_rows over BLOCKS blocks, recording the thread and the BLAS thread counts of each block."""
    seen = []

    def fn(a):
        seen.append((threading.current_thread(), blas_threads()))
        return a[:, 0] * 2 + a @ np.ones((a.shape[1],), dtype=a.dtype)

    rows = np.arange(BLOCKS * PARALLEL_ROWS * 3, dtype=np.float32).reshape(-1, 3)
    return comp.by_rows(fn, rows), seen


@pytest.mark.parametrize("device", [None, "cpu"])
def test_a_score_call_leaves_blas_settings_and_thread_count_as_they_were(problem, device):
    train, test, _ = problem
    names = ["msp", "mahalanobis"] if device is None else ["mahalanobis", "knn"]
    on = {} if device is None else {"device": device}
    fitted = [detectors.create(n, **on, **({"k": 5} if n == "knn" else {})) for n in names]
    if device is not None:
        fitted[0].fit(train).score(test)  # torch loads its kernels on the first call
    info, count = threadpool_info(), threading.active_count()
    for det in fitted:
        det.fit(train).score(test)
        assert threadpool_info() == info, det
        assert threading.active_count() == count, det


def test_the_threads_that_ran_the_blocks_end_with_the_call():
    before = blas_threads()
    got, seen = traced_blocks(Compute())
    rows = np.arange(BLOCKS * PARALLEL_ROWS * 3, dtype=np.float32).reshape(-1, 3)
    np.testing.assert_array_equal(got, rows[:, 0] * 2 + rows.sum(axis=1))
    assert len(seen) == BLOCKS
    assert all(threads == [1] * len(before) for _, threads in seen)  # each block's product on one BLAS thread
    helpers = {t for t, _ in seen} - {threading.current_thread()}
    assert not any(t.is_alive() for t in helpers)  # none kept running after the call
    assert blas_threads() == before


def test_a_users_threadpool_limits_bound_the_threads_and_are_restored():
    original = threadpool_info()
    with threadpool_limits(limits=1, user_api="blas"):
        limited = threadpool_info()
        _, seen = traced_blocks(Compute())
        assert {t for t, _ in seen} == {threading.current_thread()}  # one thread allowed: the caller's
        assert threadpool_info() == limited
    assert threadpool_info() == original


def test_a_failing_block_ends_the_helper_threads_too():
    seen = []

    def fn(a):
        seen.append(threading.current_thread())
        if a[0, 0] == 5 * PARALLEL_ROWS:
            raise ArithmeticError("block 5")
        return a[:, 0]

    before = blas_threads()
    with pytest.raises(ArithmeticError, match="block 5"):
        Compute().by_rows(fn, np.arange(BLOCKS * PARALLEL_ROWS, dtype=np.float32)[:, None])
    assert not any(t.is_alive() for t in set(seen) - {threading.current_thread()})
    assert blas_threads() == before
