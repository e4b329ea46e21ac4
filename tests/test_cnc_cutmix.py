"""CnC outliers: CutMix boxes, different-class partners, compounding, the seeded batch stream."""

import numpy as np
import pytest
from scipy import stats

from oodeval.cnc.cutmix import (
    BENCHMARK_15,
    Box,
    compound,
    cutmix,
    cutmix_box,
    different_class_partners,
    outlier_batches,
)


def _data(n=60, k=3, size=16, seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(k, size=n)
    images = rng.integers(0, 256, size=(n, size, size, 3), dtype=np.uint8)
    return images, labels


def test_partners_have_a_different_class_and_cover_all_others():
    labels = np.array([0] * 10 + [1] * 30 + [2] * 60)
    rng = np.random.default_rng(0)
    index = np.repeat(np.arange(len(labels)), 200)
    j = different_class_partners(labels, index, rng)
    assert np.all(labels[j] != labels[index])
    # uniform over the samples of the other classes: for class-0 anchors, 30:60 of classes 1:2
    from0 = labels[j[labels[index] == 0]]
    share = (from0 == 1).mean()
    assert abs(share - 30 / 90) < 0.03
    # every sample of another class is drawn for some class-0 anchor
    assert set(j[labels[index] == 0]) == set(np.flatnonzero(labels != 0))
    with pytest.raises(ValueError, match="at least 2 classes"):
        different_class_partners(np.zeros(5, int), np.arange(5), rng)


@pytest.mark.parametrize("h,w", [(32, 32), (28, 20)])
def test_box_area_matches_lambda(h, w):
    rng = np.random.default_rng(1)
    for lam in np.linspace(0, 1, 21):
        side_h, side_w = int(h * np.sqrt(1 - lam)), int(w * np.sqrt(1 - lam))
        inside = cutmix_box(h, w, lam, rng, "inside")
        assert (inside.bottom - inside.top, inside.right - inside.left) == (side_h, side_w)
        assert 0 <= inside.top and inside.bottom <= h and 0 <= inside.left and inside.right <= w
        # the pasted fraction is 1 - lambda up to the rounding of each side to whole pixels
        assert abs(inside.area / (h * w) - (1 - lam)) <= (side_h + side_w + 1) / (h * w)
        for _ in range(20):
            c = cutmix_box(h, w, lam, rng, "center")
            assert 0 <= c.top <= c.bottom <= h and 0 <= c.left <= c.right <= w
            full = (side_h // 2) * 2 * (side_w // 2) * 2
            assert c.area <= full
            clipped = c.top == 0 or c.left == 0 or c.bottom == h or c.right == w
            if not clipped:
                assert c.area == full
    with pytest.raises(ValueError, match="lam"):
        cutmix_box(8, 8, 1.5, rng)
    with pytest.raises(ValueError, match="placement"):
        cutmix_box(8, 8, 0.5, rng, "corner")


def test_cutmix_pastes_the_box_only():
    a = np.zeros((10, 12, 3), np.uint8)
    b = np.full((10, 12, 3), 255, np.uint8)
    out = cutmix(a, b, Box(2, 3, 7, 9))
    assert (out[2:7, 3:9] == 255).all()
    mask = np.ones((10, 12), bool)
    mask[2:7, 3:9] = False
    assert (out[mask] == 0).all() and (a == 0).all()


def test_compound_record_and_reproducibility():
    images, labels = _data()
    idx = np.arange(40)
    out, rec = compound(images, labels, idx, np.random.default_rng(5), placement="inside")
    assert out.shape == (40, 16, 16, 3) and out.dtype == np.uint8
    assert np.array_equal(rec["first"], idx)
    assert np.all(labels[rec["second"]] != labels[idx])
    assert set(rec["severity"]) <= {1, 2, 3, 4, 5}
    top, left, bottom, right = rec["box"].T
    assert np.all((bottom - top) == (16 * np.sqrt(1 - rec["lam"])).astype(int))
    again, _ = compound(images, labels, idx, np.random.default_rng(5), placement="inside")
    assert np.array_equal(out, again)
    other, _ = compound(images, labels, idx, np.random.default_rng(6), placement="inside")
    assert not np.array_equal(out, other)
    # restricting the pool restricts the draws
    _, rec15 = compound(images, labels, idx, np.random.default_rng(5), corruptions=("fog", "contrast"))
    assert set(rec15["corruption"]) <= {"fog", "contrast"}
    assert len(BENCHMARK_15) == 15 and "saturate" not in BENCHMARK_15


def test_lambda_is_beta_1_1_and_severity_uniform():
    images, labels = _data(n=30, size=8)
    _, rec = compound(images, labels, np.arange(30).repeat(20), np.random.default_rng(0), corruptions=("contrast",))
    assert stats.kstest(rec["lam"], "uniform").pvalue > 1e-3
    counts = np.bincount(rec["severity"], minlength=6)[1:]
    assert stats.chisquare(counts).pvalue > 1e-3


def test_outlier_batches_are_seeded_tensors():
    images, labels = _data(n=20, size=8)
    a = list(outlier_batches(images, labels, batch_size=8, seed=3))
    b = list(outlier_batches(images, labels, batch_size=8, seed=3))
    assert [x.images.shape[0] for x in a] == [8, 8, 4]
    assert tuple(a[0].images.shape[1:]) == (3, 8, 8)
    assert all(bool((x.images == y.images).all()) for x, y in zip(a, b))
    c = list(outlier_batches(images, labels, batch_size=8, seed=4))
    assert not bool((a[0].images == c[0].images).all())
    # each epoch visits every image once as the first of a pair
    firsts = np.concatenate([x.record["first"] for x in a])
    assert sorted(firsts) == list(range(20))


def test_release_augmentations():
    from oodeval.cnc.augment import crop_flip, release_source

    img = np.arange(8 * 8, dtype=np.uint8).reshape(8, 8) + 1
    out = crop_flip(np.stack([img] * 50), np.random.default_rng(0), pad=2)
    assert out.shape == (50, 8, 8) and out.dtype == np.uint8
    padded = np.pad(img, 2)
    # every output is one of the (2*pad+1)^2 crops of the zero-padded image, possibly mirrored
    crops = {padded[t : t + 8, l : l + 8].tobytes() for t in range(5) for l in range(5)}
    crops |= {padded[t : t + 8, l : l + 8][:, ::-1].tobytes() for t in range(5) for l in range(5)}
    assert all(o.tobytes() in crops for o in out)
    assert len({o.tobytes() for o in out}) > 10  # positions and flips vary
    rgb = np.random.default_rng(1).integers(1, 256, size=(16, 16, 3), dtype=np.uint8)
    src = [release_source(rgb, np.random.default_rng(s)) for s in range(20)]
    assert all(s.shape == rgb.shape and s.dtype == np.uint8 for s in src)
    # rotation by up to 15 degrees leaves black (fill 0) corners in most draws; values are copied, not blended
    assert sum((s == 0).all(axis=2).any() for s in src) >= 10
    assert all(set(np.unique(s)) <= set(np.unique(rgb)) | {0} for s in src)
