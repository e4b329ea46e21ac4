"""The float32 run sums (Compute.runsum / rundot), the class sums read where they lie, and OptFS's
float32 interval quotient: each equal to its float64 reference within what its arithmetic allows."""

import numpy as np
import pytest

from oodeval.detectors._backend import RUN, Compute
from oodeval.detectors._common import class_means

pytestmark = pytest.mark.numerics  # run again under other CPU kernels (docs/conventions.md#reproducibility)

U = 2.0**-24  # float32's unit roundoff


@pytest.mark.parametrize("device", [None, "cpu"])
@pytest.mark.parametrize("d", [1024, 1000, 3 * RUN, RUN - 7])  # whole runs, a tail, fewer entries than a run
def test_run_sums_hold_their_bound(device, d):
    """Each run's float32 sum of RUN terms (products rounded once more) is off by at most
    (RUN - 1) u + u of the sum of its terms' magnitudes; the float64 sums of the runs add nothing
    at this size. A dropped or doubled tail, or a run summed wrongly, is off by whole terms."""
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((300, d)) * rng.uniform(0.1, 10, d)).astype(np.float32)
    b = rng.standard_normal((300, d)).astype(np.float32)
    comp = Compute("float32", device)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    for got, exact, size in ((comp.get(comp.runsum(comp.put(a))), a64.sum(1), np.abs(a64).sum(1)),
                             (comp.get(comp.rundot(comp.put(a), comp.put(b))), (a64 * b64).sum(1), np.abs(a64 * b64).sum(1))):  # fmt: skip
        assert got.dtype == np.float64
        assert np.all(np.abs(got - exact) <= (RUN + 1) * U * size)
    # float64: the float64 row sums themselves
    wide = Compute("float64", device)
    np.testing.assert_array_equal(wide.get(wide.rundot(wide.put(a), wide.put(b))), wide.get(wide.rowdot(wide.put(a), wide.put(b))))


@pytest.mark.parametrize("device", [None, "cpu"])
def test_class_means_skip_unlabelled_rows_where_they_lie(device):
    """Rows labelled -1 are left out by the sparse product itself (no copy of the kept rows): the
    means equal the float64 means of the kept rows to the float32 sums' rounding (a class's sum
    over its ~n rows of a chunk: n u of the sum of magnitudes; 1e-5 relative is far above it)."""
    rng = np.random.default_rng(1)
    z = (rng.standard_normal((3000, 40)) + 5).astype(np.float32)
    y = rng.integers(0, 7, 3000)
    y[rng.random(3000) < 0.3] = -1
    classes = np.arange(7)
    means, counts = class_means(z, y, classes, comp=Compute("float32", device))
    ref = np.stack([z[y == c].astype(np.float64).mean(0) for c in classes])
    np.testing.assert_array_equal(counts, [(y == c).sum() for c in classes])
    np.testing.assert_allclose(means, ref, rtol=1e-5)


@pytest.mark.parametrize(("lo", "hi"), [(0.0, 4.7), (-1.3, 7.7), (1000.1, 1000.9), (80.0, 81.0)])
def test_optfs_float32_quotient_gives_the_exact_intervals(lo, hi):
    """float32 feature values on and next to every edge (the edges rounded to float32 and their
    float32 neighbours), zeros, and values far outside: every interval index is the float64
    search's, and a float32 block and its float64 copy get the same indices."""
    from test_peer_fast_paths import optfs_with_intervals

    det = optfs_with_intervals(lo, hi)
    edges = np.concatenate([det.left_edges_, det.right_edges_]).astype(np.float32)
    z = np.concatenate([np.random.default_rng(2).uniform(lo - (hi - lo) / 4, hi + (hi - lo) / 4, 20000), edges, [lo, 0.0] * 5,
                        np.nextafter(edges, np.float32(-np.inf)), np.nextafter(edges, np.float32(np.inf)), [1e30, -1e30]]).astype(np.float32)  # fmt: skip
    wide = z.astype(np.float64)
    k = np.searchsorted(det.left_edges_, wide, side="right") - 1
    inside = (k >= 0) & (wide < det.left_edges_[np.maximum(k, 0)] + det.width_)
    got = det._bins(z[None])[0]
    outside = got % (det.left_edges_.size + 1) == 0  # 0 or K + 1: outside every interval
    np.testing.assert_array_equal(np.where(outside, 0, got), np.where(inside, k + 1, 0))
    np.testing.assert_array_equal(got, det._bins(wide[None])[0])


def test_lts_scaled_logsumexp_holds_far_from_zero():
    """Rows whose largest scaled logit is past 80 (exp would overflow unshifted) or below -27
    (terms raised to -87 would count unshifted) are shifted by their own max: within what
    rounding to float32 allows. logsumexp moves by at most the largest change of its arguments,
    here s (f - max) rounded twice and s rounded once: 3 u |s (f - max)| <= 6 u max |s f|."""
    from scipy.special import logsumexp

    from oodeval.detectors.activation import _scaled_logsumexp

    rng = np.random.default_rng(0)
    f = (rng.standard_normal((300, 50)) * 5).astype(np.float32)
    f[:100] += 60  # s m past 80
    f[100:200] -= 60  # s m below -27
    s = rng.uniform(1, 4, 300)
    exact = f.astype(np.float64) * s[:, None]
    got = _scaled_logsumexp(Compute("float32"), f, s)
    assert np.all(np.abs(got - logsumexp(exact, axis=1)) <= 6 * U * np.abs(exact).max(axis=1))
