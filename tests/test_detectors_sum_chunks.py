"""A fit's passes over row chunks (``Compute.sum_chunks``: the scatter of the Mahalanobis family,
ViM and NECO) run one chunk per core and add the parts in chunk order: the sum is the sequential
one bit for bit whatever the thread count, the helper threads end with the call, and BLAS's
thread setting is restored."""

import threading
import time

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from oodeval.detectors._backend import Compute
from oodeval.detectors._common import scatter

ROWS, WIDTH = 9000, 500  # chunks of 8192 rows at width 500: two chunks


def blas_threads() -> list[int]:
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


def test_the_parts_are_added_in_chunk_order_whatever_finishes_first():
    comp = Compute("float64")
    slices = list(comp.chunks(64 * 1000, 1000))  # 16 chunks
    assert len(slices) > 2

    def part(sl):
        i = slices.index(sl)
        time.sleep(0.002 * ((len(slices) - i) % 3))  # later chunks often finish first
        # values whose float64 sum depends on the order of addition
        return np.array([0.1 * 3.0**i, 1.0 / (1 + sl.start)])

    total = comp.sum_chunks(part, 64 * 1000, 1000)
    expected = np.zeros(2)
    for sl in slices:
        expected = expected + part(sl)
    assert total.tolist() == expected.tolist()  # the same additions in the same order: the same bits


@pytest.mark.parametrize("labelled", [True, False])
def test_a_scatter_is_the_same_on_one_thread_and_on_all(labelled):
    rng = np.random.default_rng(0)
    z = (rng.standard_normal((ROWS, WIDTH)) * np.linspace(1e-4, 10, WIDTH) + 50).astype(np.float32)
    y = rng.integers(-1, 4, ROWS)
    classes = np.arange(4)
    centre = rng.standard_normal((4, WIDTH)) + 50 if labelled else rng.standard_normal(WIDTH) + 50
    args = (z, centre, y, classes) if labelled else (z, centre)
    before, count = threadpool_info(), threading.active_count()
    s_all, n_all = scatter(*args, comp=Compute("float64"))
    assert threadpool_info() == before and threading.active_count() == count
    with threadpool_limits(1):
        s_one, n_one = scatter(*args, comp=Compute("float64"))
    # each chunk's product is the same call on one BLAS thread, and the parts are added in chunk
    # order either way: the same code on the same inputs in one process gives the same bits
    assert n_all == n_one == (int((y >= 0).sum()) if labelled else ROWS)
    assert np.array_equal(s_all, s_one)
    # and it is the scatter: float64 products of centred rows (tolerance: float64 sums of 9000
    # terms of size ~100, relative to the matrix's largest entries)
    keep = y >= 0 if labelled else slice(None)
    c = z[keep].astype(np.float64) - (centre[y[keep]] if labelled else centre)
    assert np.allclose(s_all, c.T @ c, rtol=0, atol=1e-10 * np.abs(c.T @ c).max())


def test_a_failing_chunk_ends_the_helper_threads_and_restores_blas():
    seen, before = [], blas_threads()
    third = list(Compute("float64").chunks(64 * 1000, 1000))[3]

    def part(sl):
        seen.append(threading.current_thread())
        if sl == third:
            raise ArithmeticError("chunk 3")
        return np.ones(2)

    with pytest.raises(ArithmeticError, match="chunk 3"):
        Compute("float64").sum_chunks(part, 64 * 1000, 1000)
    assert not any(t.is_alive() for t in set(seen) - {threading.current_thread()})
    assert blas_threads() == before


def test_a_float32_scatter_is_summed_in_float64():
    # NECO's scatter: float32 products of each chunk, added into a float64 sum. The first chunk
    # (8192 rows) adds 8192 x 2^20 = 2^33, the second (808 rows) 808 x 2^-20: every product and
    # chunk sum is exact in float32, and their total is exact in float64 (51 bits) but not in
    # float32 (the second chunk's sum is below half an ulp of 2^33), so the equality is exact
    z = np.zeros((ROWS, WIDTH), dtype=np.float32)
    z[:8192, 0], z[8192:, 0] = 2.0**10, 2.0**-10
    s, n = scatter(z, np.zeros(WIDTH), comp=Compute("float32"))
    assert n == ROWS and len(list(Compute("float32").chunks(ROWS, WIDTH))) == 2
    assert s[0, 0] == 2.0**33 + 808 * 2.0**-20
