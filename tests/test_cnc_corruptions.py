"""The ImageNet-C family corruptions: shapes, dtype, determinism, formulas, strength vs severity."""

import math

import numpy as np
import pytest
from skimage import data, transform

from oodeval.cnc.corruptions import (
    BENCHMARK_15, CORRUPTIONS, DEFAULT_POOL, RELEASE_POOL, corrupt, motion_blur_kernel, pool, preset_for,
)  # fmt: skip


def _photo(img: np.ndarray, size: int) -> np.ndarray:
    return np.rint(transform.resize(img, (size, size), anti_aliasing=True) * 255).astype(np.uint8)


@pytest.fixture(scope="module")
def photos() -> dict[int, list[np.ndarray]]:
    srcs = [data.astronaut(), data.chelsea(), data.coffee()]
    return {size: [_photo(s, size) for s in srcs] for size in (32, 64)}


def test_nineteen_corruptions_and_the_release_pool():
    assert len(CORRUPTIONS) == len(set(CORRUPTIONS)) == 19 and "spatter" in CORRUPTIONS
    # cnc-ood/cnc_ood augmentations/__init__.py: no motion blur, pixelate, JPEG; adds speckle, gaussian blur, saturate
    assert DEFAULT_POOL == RELEASE_POOL and len(set(RELEASE_POOL)) == 15
    assert not {"motion_blur", "pixelate", "jpeg_compression", "spatter"} & set(RELEASE_POOL)
    assert {"speckle_noise", "gaussian_blur", "saturate"} <= set(RELEASE_POOL)
    assert set(BENCHMARK_15) == set(CORRUPTIONS) - {"speckle_noise", "gaussian_blur", "spatter", "saturate"}
    assert pool("release") == RELEASE_POOL and pool("imagenet-c") == BENCHMARK_15 and pool("fog,contrast") == ("fog", "contrast")
    with pytest.raises(ValueError, match="unknown or empty"):
        pool("fog,nope")


def test_frost_uses_the_reference_photos_when_installed(monkeypatch, request):
    import oodeval.cnc.corruptions as C

    request.addfinalizer(C._scaled_photo.cache_clear)

    img = _photo(data.astronaut(), 32)
    photos = C.frost_photos()  # the test extra installs the imagecorruptions wheel
    assert photos is not None and len(photos) == 6 and C.frost_source().startswith("photos")
    a = corrupt(img, "frost", 3, np.random.default_rng(0))
    # the procedural stand-in when the wheel is absent, and the choice is reported
    monkeypatch.setattr(C, "frost_photos", lambda: None)
    assert C.frost_source().startswith("procedural")
    b = corrupt(img, "frost", 3, np.random.default_rng(0))
    assert b.shape == img.shape and not np.array_equal(a, b)
    # a photo crop blended with the reference constants: c0 x + c1 frost (CIFAR-10-C severity 1: 1, 0.2)
    fake = (np.full((300, 400, 3), 200, np.uint8),) * 6
    monkeypatch.setattr(C, "frost_photos", lambda: fake)
    C._scaled_photo.cache_clear()  # scaled photos are cached per (photo, scale, size)
    out = corrupt(img, "frost", 1, np.random.default_rng(0))
    np.testing.assert_array_equal(out, np.clip(np.rint(np.clip(img / 255.0 + 0.2 * 200 / 255.0, 0, 1) * 255), 0, 255))
    # imagecorruptions (the release) always enlarges the photo 1.1x (after fitting a smaller one);
    # the Hendrycks presets use their fixed factor (ImageNet-C: 1, no resize)
    # (imagecorruptions: new size = ceil(side * 1.1 * fit) in float64, so 400 * 1.1 gives 441)
    assert C._scaled_photo(0, None, 32, 32).shape == (math.ceil(300 * 1.1), math.ceil(400 * 1.1), 3) == (330, 441, 3)
    assert C._scaled_photo(0, None, 600, 32).shape == (math.ceil(300 * 2 * 1.1), math.ceil(400 * 2 * 1.1), 3)
    assert C._scaled_photo(0, 1.0, 32, 32).shape == (300, 400, 3)


@pytest.mark.parametrize("shape", [(32, 32, 3), (28, 28), (28, 28, 1), (40, 48, 3)])
def test_shape_dtype_range_and_change(shape, photos):
    base = photos[64][0]
    img = np.rint(transform.resize(base, shape[:2] + (3,), anti_aliasing=True) * 255).astype(np.uint8)
    if len(shape) == 2:
        img = img.mean(axis=2).astype(np.uint8)
    elif shape[2] == 1:
        img = img.mean(axis=2, keepdims=True).astype(np.uint8)
    for name in CORRUPTIONS:
        out = corrupt(img, name, 5, np.random.default_rng(0))
        assert out.shape == img.shape and out.dtype == np.uint8, name
        assert np.unique(out).size > 1, f"{name} produced a flat image"
        assert np.abs(out.astype(int) - img).mean() > 0.5, f"{name} at severity 5 left the image unchanged"


def test_seeded_and_random():
    img = _photo(data.astronaut(), 32)
    for name in CORRUPTIONS:
        a = corrupt(img, name, 3, np.random.default_rng(7))
        b = corrupt(img, name, 3, np.random.default_rng(7))
        assert np.array_equal(a, b), f"{name} is not reproducible under one seed"
    for name in ("gaussian_noise", "shot_noise", "impulse_noise", "glass_blur", "fog", "frost", "snow", "elastic_transform"):
        a = corrupt(img, name, 3, np.random.default_rng(1))
        b = corrupt(img, name, 3, np.random.default_rng(2))
        assert not np.array_equal(a, b), f"{name} ignores its generator"


def test_preset_by_size():
    assert preset_for((32, 32, 3)) == "cifar" and preset_for((28, 28)) == "cifar"
    assert preset_for((33, 32, 3)) == "tinyimagenet" and preset_for((64, 64, 3)) == "tinyimagenet"
    assert preset_for((65, 64, 3)) == "imagenet" and preset_for((224, 224, 3)) == "imagenet"
    img = _photo(data.astronaut(), 32)
    # CIFAR-10-C contrast c=0.75 at severity 1, ImageNet-C c=0.4
    cif = corrupt(img, "contrast", 1, np.random.default_rng(0))
    imn = corrupt(img, "contrast", 1, np.random.default_rng(0), preset="imagenet")
    assert np.abs(imn.astype(int) - img).mean() > np.abs(cif.astype(int) - img).mean()


def test_formulas_match_the_reference_definitions():
    img = _photo(data.chelsea(), 32)
    x = img / 255.0
    # contrast (CIFAR-10-C severity 2: c = 0.5): (x - mean) * c + mean per channel
    mean = x.mean(axis=(0, 1), keepdims=True)
    expect = np.rint(np.clip((x - mean) * 0.5 + mean, 0, 1) * 255)
    assert np.array_equal(corrupt(img, "contrast", 2, np.random.default_rng(0)), expect.astype(np.uint8))
    # brightness on grey: HSV value + c with c = 0.15 at CIFAR severity 3
    grey = img.mean(axis=2).astype(np.uint8)
    expect = np.rint(np.clip(grey / 255.0 + 0.15, 0, 1) * 255)
    assert np.abs(corrupt(grey, "brightness", 3, np.random.default_rng(0)).astype(int) - expect).max() <= 1
    # gaussian noise on mid grey: residual std = c * 255 (ImageNet-C severity 1: 0.08)
    flat = np.full((64, 64, 3), 128, np.uint8)
    res = corrupt(flat, "gaussian_noise", 1, np.random.default_rng(0), preset="imagenet").astype(float) - 128
    assert abs(res.std() - 0.08 * 255) < 0.05 * 0.08 * 255
    # pixelate (ImageNet-C severity 5: 0.25): a 64 px image becomes 16 x 16 blocks of 4 x 4
    big = _photo(data.astronaut(), 64)
    px = corrupt(big, "pixelate", 5, np.random.default_rng(0), preset="imagenet").astype(int)
    blocks = px.reshape(16, 4, 16, 4, 3)
    assert (blocks.max(axis=(1, 3)) - blocks.min(axis=(1, 3))).max() <= 1
    # Tiny-ImageNet-C (the auto preset at 64 px): gaussian noise severity 2 is 0.08, pixelate 5 is 0.5
    res = corrupt(flat, "gaussian_noise", 2, np.random.default_rng(0)).astype(float) - 128
    assert abs(res.std() - 0.08 * 255) < 0.05 * 0.08 * 255
    blocks = corrupt(big, "pixelate", 5, np.random.default_rng(0)).astype(int).reshape(32, 2, 32, 2, 3)
    assert (blocks.max(axis=(1, 3)) - blocks.min(axis=(1, 3))).max() <= 1


def test_motion_kernel_is_a_one_sided_line():
    w, off = motion_blur_kernel(radius=6, sigma=2, angle=0)
    assert w.shape == (13,) and abs(w.sum() - 1) < 1e-12 and np.all(np.diff(w) < 0)
    assert np.array_equal(off[:, 0], np.zeros(13)) and np.array_equal(off[:, 1], np.arange(13))
    _, off90 = motion_blur_kernel(radius=6, sigma=2, angle=90)
    assert np.array_equal(off90[:, 0], np.arange(13)) and np.array_equal(off90[:, 1], np.zeros(13))


def _strength(imgs, name, preset_size, metric="mad", seeds=(0, 1)):
    out = []
    for sev in range(1, 6):
        vals = []
        for img in imgs:
            for s in seeds:
                c = corrupt(img, name, sev, np.random.default_rng(s)).astype(float)
                if metric == "mad":
                    vals.append(np.abs(c - img).mean())
                else:  # 1 - Pearson correlation with the clean image
                    vals.append(1 - np.corrcoef(c.ravel(), img.ravel().astype(float))[0, 1])
        out.append(np.mean(vals))
    return np.array(out)


# corruptions whose reference constants are not monotone in pixel change (documented in docs/cnc.md)
_NOT_MONOTONE = {"glass_blur", "elastic_transform", "saturate", "spatter"}


@pytest.mark.parametrize("size", [32, 64])
def test_strength_increases_with_severity(size, photos):
    imgs = photos[size]
    for name in CORRUPTIONS:
        if name in _NOT_MONOTONE:
            continue
        d = _strength(imgs, name, size, "corr" if name == "frost" else "mad")
        steps = np.diff(d)
        assert np.all(steps >= 0) and d[4] > d[0], f"{name} at {size} px: strength {np.round(d, 3)}"


def test_documented_non_monotone_corruptions(photos):
    imgs = photos[32]
    # saturate: severities 1-2 desaturate (x0.3, x0.1), 3-5 oversaturate (x1.5, x2 + .1, x2.5 + .2)
    sat = []
    for sev in range(1, 6):
        out = corrupt(imgs[0], "saturate", sev, np.random.default_rng(0))
        sat.append(np.ptp(out.astype(float), axis=2).mean())  # chroma proxy: max - min channel
    clean = np.ptp(imgs[0].astype(float), axis=2).mean()
    assert sat[1] < sat[0] < clean < sat[2] < sat[3] < sat[4]
    # glass blur at 32 px: severities 4-5 shuffle twice and move more pixels than severities 1-3
    g = _strength(imgs, "glass_blur", 32)
    assert min(g[3], g[4]) > max(g[:3])
    # spatter: severities 1-3 are water drops, 4-5 mud; stronger within each regime
    sp = _strength(imgs, "spatter", 32)
    assert sp[0] < sp[1] < sp[2] and sp[3] < sp[4]
    # elastic: every severity warps the image
    e = _strength(imgs, "elastic_transform", 32)
    assert np.all(e > 1.0)


def test_bad_input_is_rejected():
    img = np.zeros((32, 32, 3), np.uint8)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="uint8"):
        corrupt(img.astype(np.float32), "fog", 1, rng)
    with pytest.raises(ValueError, match="unknown corruption"):
        corrupt(img, "spatter-ish", 1, rng)
    for sev in (0, 6, 2.5):
        with pytest.raises(ValueError, match="severity"):
            corrupt(img, "fog", sev, rng)
    with pytest.raises(ValueError, match="shape"):
        corrupt(np.zeros((32, 32, 4), np.uint8), "fog", 1, rng)


def _release_field(h, w, severity, rng):
    """imagecorruptions 1.1.2's elastic_transform displacement (what the CnC release ran), re-derived:
    alpha = 250 x (0.05, 0.065, 0.085, 0.1, 0.12); U(-0.005 h, 0.005 h) noise for dx, then dy; a
    Gaussian of sigma (0.01 h, 0.01 w), reflect border, truncated at 3 sigma."""
    from scipy.ndimage import gaussian_filter

    alpha = 250 * (0.05, 0.065, 0.085, 0.1, 0.12)[severity - 1]
    m = 0.005 * h
    dx = gaussian_filter(rng.uniform(-m, m, size=(h, w)), (0.01 * h, 0.01 * w), mode="reflect", truncate=3) * alpha
    dy = gaussian_filter(rng.uniform(-m, m, size=(h, w)), (0.01 * h, 0.01 * w), mode="reflect", truncate=3) * alpha
    return dy, dx


@pytest.mark.parametrize("size", [32, 64])
def test_elastic_matches_the_release_strength_at_every_severity(size, photos):
    from scipy.ndimage import map_coordinates

    from oodeval.cnc.corruptions import elastic_displacement
    from oodeval.cnc.train import CnCTrainConfig

    assert CnCTrainConfig.recipe("cnc-cifar", num_classes=10).severity == "imagecorruptions"
    rms = []
    for sev in range(1, 6):
        ours, ref = [], []
        for seed in range(4):
            alpha = 250 * (0.05, 0.065, 0.085, 0.1, 0.12)[sev - 1]
            ours.append(np.hypot(*elastic_displacement(size, size, alpha, np.random.default_rng(seed))))
            ref.append(np.hypot(*_release_field(size, size, sev, np.random.default_rng(seed))))
        ours, ref = np.concatenate(ours), np.concatenate(ref)
        for stat in (np.mean, lambda d: np.sqrt(np.mean(d**2)), np.max):
            assert abs(stat(ours) / stat(ref) - 1) < 0.10, (size, sev)
        rms.append(np.sqrt(np.mean(ref**2)))
        # and corrupt() applies exactly that warp (bilinear, reflect), up to uint8 rounding
        img = photos[size][0]
        out = corrupt(img, "elastic_transform", sev, np.random.default_rng(7), preset="imagecorruptions")
        dy, dx = _release_field(size, size, sev, np.random.default_rng(7))
        rr, cc = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
        want = np.stack([map_coordinates(img[..., c] / 255.0, [rr + dy, cc + dx], order=1, mode="reflect") for c in range(3)], 2)
        assert np.abs(out.astype(float) - np.rint(np.clip(want, 0, 1) * 255)).max() <= 1
    assert np.all(np.diff(rms) > 0)  # the release's elastic strength grows with severity
