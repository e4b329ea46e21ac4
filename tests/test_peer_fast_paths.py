"""The faster formulations of the peers' methods against their direct definitions: ASH-B's top-k
fill by one partition (ties included), VRA's per-dimension percentiles by one partition, OptFS's
intervals by arithmetic (edge values included), LTS's top-k of relu(z) as relu of the top k."""

import numpy as np
import pytest

from oodeval import detectors
from oodeval.detectors.activation import _column_percentiles, ash_b_features
from oodeval.features import FeatureSet


def _ash_b_direct(z, percentile):
    d = z.shape[1]
    k = d - int(np.round(d * percentile / 100.0))
    top = np.argsort(-z, axis=1, kind="stable")[:, :k]
    out = np.zeros_like(z)
    np.put_along_axis(out, top, (z.astype(np.float64).sum(1) / k).astype(z.dtype)[:, None], axis=1)
    return out


def test_ash_b_fills_exactly_k_entries_with_ties_and_zeros():
    rng = np.random.default_rng(0)
    z = np.maximum(rng.normal(size=(64, 40)), 0).astype(np.float32)  # about half zeros: ties at t = 0
    z[:8, :30] = 1.0  # ties above zero
    got = ash_b_features(z, 65)
    ref = _ash_b_direct(z, 65)
    k = 40 - int(np.round(40 * 0.65))
    assert (np.count_nonzero(got, axis=1) <= k).all() and (np.count_nonzero(got == ref.max(1, keepdims=True), axis=1) == k).all()
    # the kept values are each row's fill (s1 / k), on k entries none smaller than the dropped ones
    np.testing.assert_array_equal(np.sort(got, axis=1), np.sort(ref, axis=1))
    for row, kept in zip(z, got != 0):
        if kept.any() and (~kept).any():
            assert row[kept].min() >= row[~kept].max()


@pytest.mark.parametrize("qs", [(10.0, 90.0), (1.0, 99.0), (0.0, 100.0), (50.0, 50.0), (33.3, 66.6)])
def test_column_percentiles_are_numpys(qs):
    z = np.random.default_rng(1).normal(size=(1001, 37)).astype(np.float32)
    for got, q in zip(_column_percentiles(z, qs, block=8), qs):
        np.testing.assert_array_equal(got, np.percentile(z.astype(np.float64), q, axis=0))  # same order statistics, same lerp


def optfs_with_intervals(lo: float, hi: float):
    """An OptFS whose fit found the quantiles lo and hi (its intervals set as its fit sets them)."""
    det = detectors.create("optfs")
    det.width_ = (hi - lo) / 100.0
    det.left_edges_ = np.arange(lo, hi, det.width_)
    det.right_edges_ = det.left_edges_ + det.width_
    eps = np.finfo(np.float64).eps
    det.edge_tolerance_ = max(1e-9, 64 * eps * (abs(lo) + abs(hi) + det.width_) / det.width_)
    return det


@pytest.mark.parametrize(("lo", "hi"), [(-1.3, 7.7), (1000.1, 1000.9), (-5e-3, 3e-2), (1e4, 1e4 + 1e-3)])
def test_optfs_intervals_are_the_release_search(lo, hi):
    det = optfs_with_intervals(lo, hi)
    edges = np.concatenate([det.left_edges_, det.right_edges_])
    z = np.concatenate([np.random.default_rng(2).uniform(lo - (hi - lo) / 4, hi + (hi - lo) / 4, 20000), edges, [lo] * 5,
                        np.nextafter(edges, -np.inf), np.nextafter(edges, np.inf), [1e30, -1e30]])  # fmt: skip
    k = np.searchsorted(det.left_edges_, z, side="right") - 1
    inside = (k >= 0) & (z < det.left_edges_[np.maximum(k, 0)] + det.width_)
    got = det._bins(z[None])[0]
    outside = got % (det.left_edges_.size + 1) == 0  # 0 or K + 1: outside every interval
    np.testing.assert_array_equal(np.where(outside, 0, got), np.where(inside, k + 1, 0))


def test_lts_reads_relu_of_the_top_k():
    rng = np.random.default_rng(3)
    z = rng.normal(size=(50, 64)).astype(np.float32)
    z[:5] = -np.abs(z[:5])  # rows with no positive entry: S = 1
    f = rng.normal(size=(50, 7)).astype(np.float32) * 5
    w, b = rng.normal(size=(7, 64)).astype(np.float32), np.zeros(7, np.float32)
    x = FeatureSet(z, logits=f, weight=w, bias=b)
    relu = np.maximum(z.astype(np.float64), 0)
    top = np.sort(relu, axis=1)[:, -max(1, 64 - int(round(64 * 0.95))) :].sum(1)
    s = np.where(top > 0, relu.sum(1) / np.where(top > 0, top, 1), 1.0) ** 2
    scaled = f.astype(np.float64) * s[:, None]
    ref = scaled.max(1) + np.log(np.exp(scaled - scaled.max(1, keepdims=True)).sum(1))
    np.testing.assert_allclose(detectors.create("lts", compute_dtype="float64").fit().score(x), ref, rtol=1e-12)
    # float32: each scaled logit rounded once (a float32 ulp of S f), the exp and sum to a few more
    got = detectors.create("lts").fit().score(x)
    assert (np.abs(got - ref) <= 8 * np.finfo(np.float32).eps * np.abs(scaled).max(1)).all()


@pytest.mark.parametrize("q", [0.0, 0.1, 10.0, 50.0, 99.9, 100.0])
def test_chunked_percentile_with_a_large_share_of_ties(q):
    """ReLU-like values (about half exactly 0) and a few levels: the values at an end of the sampled
    range are counted, not kept, and the order statistics stay numpy's."""
    from oodeval.detectors._common import chunked_percentile

    rng = np.random.default_rng(4)
    for a in (np.maximum(rng.normal(size=(3000, 64)), 0).astype(np.float32), rng.integers(0, 3, (2000, 50)).astype(np.float32)):
        assert chunked_percentile(a, q) == pytest.approx(np.percentile(a.astype(np.float64).ravel(), q), rel=1e-12, abs=1e-300)
