"""The 19 ImageNet-C family corruptions at severity 1-5, offline, on numpy 2.

Reference: Hendrycks & Dietterich, "Benchmarking Neural Network Robustness to Common
Corruptions and Perturbations" (ICLR 2019), code ``hendrycks/robustness``:
``ImageNet-C/create_c/make_cifar_c.py`` (CIFAR-10-C constants, used for inputs whose longer
side is <= 32 px), ``make_tinyimagenet_c.py`` (Tiny-ImageNet-C, longer side <= 64 px) and
``ImageNet-C/imagenet_c/imagenet_c/corruptions.py`` (ImageNet-C constants, larger inputs);
``preset=`` selects one explicitly. ``preset="imagecorruptions"`` is the package the CnC release
ran (``imagecorruptions`` 1.1.2) on its 32 px CIFAR and 64 px Tiny-ImageNet images: ImageNet-C's
constants except its rewritten, size-relative elastic transform (:func:`elastic_displacement`)
and its frost photo scaling. Every severity constant below is the reference's; the
operations are re-implemented with numpy / scipy / scikit-image / PIL (no OpenCV, no Wand):

- motion blur (and the streaks of ``snow``): ImageMagick's ``MotionBlurImage`` kernel, i.e. a
  one-sided line of ``2*radius+1`` taps weighted ``exp(-i^2 / (2 sigma^2))``, offsets rounded to
  whole pixels along the angle, edge pixels repeated;
- ``frost``: the reference blends the image with a random crop of one of its frost photographs
  (``randint(5)``: the first five of six). The photos ship in the ``imagecorruptions`` wheel
  (Apache-2.0; ``pip install oodeval[frost]``) and are used when it is installed (found without
  importing it, so its OpenCV dependency is never loaded); the photo is scaled by the preset's
  factor (CIFAR 0.2, Tiny-ImageNet 0.3, ImageNet 1; where that leaves it smaller than the image,
  oodeval enlarges it to 1.1x the fit), or, for ``imagecorruptions``, always by 1.1 x the fit
  (1.1 when the photo is larger than the image, as that package does), then cropped at a random
  position. Without the wheel a
  documented procedural substitute is drawn (:func:`frost_layer`: needle crystals over a
  plasma-fractal haze). :func:`frost_source` says which one is in use; both are blended with
  the reference constants ``c0 * x + c1 * frost``;
- glass blur keeps the reference's effective behaviour: its tuple "swap" of two numpy views
  copies the neighbour into the pixel and leaves the neighbour unchanged, so pixels are copied
  from up to ``delta`` px up/left (``randint(-delta, delta)`` excludes ``+delta``), which is what
  the published CIFAR-10-C / ImageNet-C files contain;
- ``spatter``: OpenCV's Canny (thresholds 50/150) becomes scikit-image's Canny with a 0.5 px
  smoothing, its 5x5 L2 distance transform scipy's exact Euclidean one, ``equalizeHist`` and the
  saturating 8-bit ``filter2D`` are re-implemented; the constants and the water / mud branches
  are the reference's;
- sizes that the reference hard-codes (32 or 224) follow the input (fog's plasma map is the
  next power of two; glass blur shuffles the whole image; elastic's smoothing and affine jitter
  scale with the shorter side and its displacement amplitude with the side squared, so the warp
  is geometrically the reference's at other sizes and identical at 32 / 224 px).

Grayscale inputs (H, W) or (H, W, 1) stay grayscale: channel-wise operations run on the single
channel; the colour operations (brightness, saturate) run on the grey image replicated to RGB
and come back through ITU-R 601 luma.

API: ``corrupt(image, name, severity, rng, preset="auto") -> uint8`` of the input's shape;
``CORRUPTIONS`` lists the 19 names. All randomness comes from the given ``numpy`` Generator.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image
from scipy import ndimage
from skimage import color, draw, feature, filters, transform

from ..errors import InputError

__all__ = [
    "CORRUPTIONS", "RELEASE_POOL", "BENCHMARK_15", "POOLS", "DEFAULT_POOL", "PRESETS", "corrupt", "preset_for",
    "pool", "frost_layer", "frost_photos", "frost_source", "plasma_fractal", "motion_blur_kernel", "elastic_displacement",
]  # fmt: skip

#: the 19 ImageNet-C corruptions: the 15 benchmark ones, then the 4 extra (speckle, gaussian
#: blur, spatter, saturate), in the reference's order
CORRUPTIONS: tuple[str, ...] = (
    "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur",
    "motion_blur", "zoom_blur", "snow", "frost", "fog", "brightness", "contrast",
    "elastic_transform", "pixelate", "jpeg_compression",
    "speckle_noise", "gaussian_blur", "spatter", "saturate",
)  # fmt: skip

#: the CnC release's pool (``cnc-ood/cnc_ood``, ``augmentations/__init__.py``, ``corrupt_name``),
#: in its order: no motion blur, pixelate or JPEG; speckle noise, Gaussian blur and saturate added
RELEASE_POOL: tuple[str, ...] = (
    "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "snow", "fog",
    "zoom_blur", "contrast", "elastic_transform", "brightness", "speckle_noise", "gaussian_blur",
    "saturate", "frost",
)  # fmt: skip

#: the 15 ImageNet-C benchmark corruptions (Hendrycks & Dietterich's test set)
BENCHMARK_15: tuple[str, ...] = CORRUPTIONS[:15]

#: named pools: ``release`` (the default), ``imagenet-c`` (the benchmark 15), ``all`` (19)
POOLS: dict[str, tuple[str, ...]] = {"release": RELEASE_POOL, "imagenet-c": BENCHMARK_15, "all": CORRUPTIONS}

#: the default outlier pool: the CnC release's
DEFAULT_POOL: tuple[str, ...] = RELEASE_POOL

#: severity-constant sets: the three references' and ``imagecorruptions`` (the package the CnC release ran)
PRESETS = ("cifar", "tinyimagenet", "imagenet", "imagecorruptions")

_LUMA = np.array([0.299, 0.587, 0.114])

# (preset -> severity constants), copied from the two reference files
_C: dict[str, dict[str, list]] = {
    "cifar": {
        "gaussian_noise": [0.04, 0.06, 0.08, 0.09, 0.10],
        "shot_noise": [500, 250, 100, 75, 50],
        "impulse_noise": [0.01, 0.02, 0.03, 0.05, 0.07],
        "speckle_noise": [0.06, 0.1, 0.12, 0.16, 0.2],
        "gaussian_blur": [0.4, 0.6, 0.7, 0.8, 1.0],
        "glass_blur": [(0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)],
        "defocus_blur": [(0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)],
        "motion_blur": [(6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)],
        "zoom_blur": [np.arange(1, 1.06, 0.01), np.arange(1, 1.11, 0.01), np.arange(1, 1.16, 0.01),
                      np.arange(1, 1.21, 0.01), np.arange(1, 1.26, 0.01)],
        "fog": [(0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75)],
        "frost": [(1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45)],
        "snow": [(0.1, 0.2, 1, 0.6, 8, 3, 0.95), (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
                 (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9), (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
                 (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8)],
        "contrast": [0.75, 0.5, 0.4, 0.3, 0.15],
        "brightness": [0.05, 0.1, 0.15, 0.2, 0.3],
        "saturate": [(0.3, 0), (0.1, 0), (1.5, 0), (2, 0.1), (2.5, 0.2)],
        "spatter": [(0.62, 0.1, 0.7, 0.7, 0.5, 0), (0.65, 0.1, 0.8, 0.7, 0.5, 0), (0.65, 0.3, 1, 0.69, 0.5, 0),
                    (0.65, 0.1, 0.7, 0.69, 0.6, 1), (0.65, 0.1, 0.5, 0.68, 0.6, 1)],
        "jpeg_compression": [80, 65, 58, 50, 40],
        "pixelate": [0.95, 0.9, 0.85, 0.75, 0.65],
        # (alpha, sigma, affine jitter) as fractions of the 32 px side (IMSIZE * f in the reference)
        "elastic_transform": [(0, 0, 0.08, 32), (0.05, 0.2, 0.07, 32), (0.08, 0.06, 0.06, 32),
                              (0.1, 0.04, 0.05, 32), (0.1, 0.03, 0.03, 32)],
    },
    "tinyimagenet": {
        "gaussian_noise": [0.04, 0.08, 0.12, 0.15, 0.18],
        "shot_noise": [250, 100, 50, 30, 15],
        "impulse_noise": [0.01, 0.02, 0.05, 0.08, 0.14],
        "speckle_noise": [0.15, 0.2, 0.25, 0.3, 0.35],
        "gaussian_blur": [0.5, 0.75, 1, 1.25, 1.5],
        "glass_blur": [(0.1, 1, 1), (0.5, 1, 1), (0.6, 1, 2), (0.7, 2, 1), (0.9, 2, 2)],
        "defocus_blur": [(0.5, 0.6), (1, 0.1), (1.5, 0.1), (2.5, 0.01), (3, 0.1)],
        "motion_blur": [(10, 1), (10, 1.5), (10, 2), (10, 2.5), (12, 3)],
        "zoom_blur": [np.arange(1, 1.06, 0.01), np.arange(1, 1.11, 0.01), np.arange(1, 1.16, 0.01),
                      np.arange(1, 1.21, 0.01), np.arange(1, 1.26, 0.01)],
        "fog": [(0.4, 3), (0.7, 3), (1, 2.5), (1.5, 2), (2, 1.75)],
        "frost": [(1, 0.3), (0.9, 0.4), (0.8, 0.45), (0.75, 0.5), (0.7, 0.55)],
        "snow": [(0.1, 0.2, 1, 0.6, 8, 3, 0.8), (0.1, 0.2, 1, 0.5, 10, 4, 0.8),
                 (0.15, 0.3, 1.75, 0.55, 10, 4, 0.7), (0.25, 0.3, 2.25, 0.6, 12, 6, 0.65),
                 (0.3, 0.3, 1.25, 0.65, 14, 12, 0.6)],
        "contrast": [0.4, 0.3, 0.2, 0.1, 0.05],
        "brightness": [0.1, 0.2, 0.3, 0.4, 0.5],
        "saturate": [(0.3, 0), (0.1, 0), (2, 0), (5, 0.1), (30, 0.2)],
        "spatter": [(0.62, 0.1, 0.7, 0.7, 0.6, 0), (0.65, 0.1, 0.8, 0.7, 0.6, 0), (0.65, 0.3, 1, 0.69, 0.6, 0),
                    (0.65, 0.1, 0.7, 0.68, 0.6, 1), (0.65, 0.1, 0.5, 0.67, 0.6, 1)],
        "jpeg_compression": [65, 58, 50, 40, 25],
        "pixelate": [0.9, 0.8, 0.7, 0.6, 0.5],
        "elastic_transform": [(0, 0, 0.08, 64), (0.05, 0.3, 0.06, 64), (0.1, 0.08, 0.06, 64),
                              (0.1, 0.03, 0.03, 64), (0.16, 0.03, 0.02, 64)],
    },
    "imagenet": {
        "gaussian_noise": [0.08, 0.12, 0.18, 0.26, 0.38],
        "shot_noise": [60, 25, 12, 5, 3],
        "impulse_noise": [0.03, 0.06, 0.09, 0.17, 0.27],
        "speckle_noise": [0.15, 0.2, 0.35, 0.45, 0.6],
        "gaussian_blur": [1, 2, 3, 4, 6],
        "glass_blur": [(0.7, 1, 2), (0.9, 2, 1), (1, 2, 3), (1.1, 3, 2), (1.5, 4, 2)],
        "defocus_blur": [(3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5)],
        "motion_blur": [(10, 3), (15, 5), (15, 8), (15, 12), (20, 15)],
        "zoom_blur": [np.arange(1, 1.11, 0.01), np.arange(1, 1.16, 0.01), np.arange(1, 1.21, 0.02),
                      np.arange(1, 1.26, 0.02), np.arange(1, 1.31, 0.03)],
        "fog": [(1.5, 2), (2, 2), (2.5, 1.7), (2.5, 1.5), (3, 1.4)],
        "frost": [(1, 0.4), (0.8, 0.6), (0.7, 0.7), (0.65, 0.7), (0.6, 0.75)],
        "snow": [(0.1, 0.3, 3, 0.5, 10, 4, 0.8), (0.2, 0.3, 2, 0.5, 12, 4, 0.7),
                 (0.55, 0.3, 4, 0.9, 12, 8, 0.7), (0.55, 0.3, 4.5, 0.85, 12, 8, 0.65),
                 (0.55, 0.3, 2.5, 0.85, 12, 12, 0.55)],
        "contrast": [0.4, 0.3, 0.2, 0.1, 0.05],
        "brightness": [0.1, 0.2, 0.3, 0.4, 0.5],
        "saturate": [(0.3, 0), (0.1, 0), (2, 0), (5, 0.1), (20, 0.2)],
        "spatter": [(0.65, 0.3, 4, 0.69, 0.6, 0), (0.65, 0.3, 3, 0.68, 0.6, 0), (0.65, 0.3, 2, 0.68, 0.5, 0),
                    (0.65, 0.3, 1, 0.65, 1.5, 1), (0.67, 0.4, 1, 0.65, 1.5, 1)],
        "jpeg_compression": [25, 18, 15, 10, 7],
        "pixelate": [0.6, 0.5, 0.4, 0.3, 0.25],
        # the reference writes 244 * f for a 224 image ("244 should have been 224"): f * 244/224
        "elastic_transform": [(2 * 244 / 224, 0.7 * 244 / 224, 0.1 * 244 / 224, 224),
                              (2 * 244 / 224, 0.08 * 244 / 224, 0.2 * 244 / 224, 224),
                              (0.05 * 244 / 224, 0.01 * 244 / 224, 0.02 * 244 / 224, 224),
                              (0.07 * 244 / 224, 0.01 * 244 / 224, 0.02 * 244 / 224, 224),
                              (0.12 * 244 / 224, 0.01 * 244 / 224, 0.02 * 244 / 224, 224)],
    },
}  # fmt: skip
# imagecorruptions 1.1.2 (bethgelab/imagecorruptions, ``corruptions.py``; what the CnC release ran):
# ImageNet-C's constants, except elastic_transform, which it rewrote: no affine part, a
# displacement alpha * gaussian(U(-0.005 H, 0.005 H), sigma = 0.01 (H, W)) with alpha = 250 x
# (0.05, 0.065, 0.085, 0.1, 0.12); and frost, whose photo it always scales (see _frost_scale)
_C["imagecorruptions"] = dict(_C["imagenet"], elastic_transform=[250 * f for f in (0.05, 0.065, 0.085, 0.1, 0.12)])


def preset_for(shape: tuple[int, ...]) -> str:
    """The references' constants by resolution: longer side <= 32 px ``"cifar"`` (CIFAR-10-C),
    <= 64 px ``"tinyimagenet"`` (Tiny-ImageNet-C), else ``"imagenet"`` (ImageNet-C)."""
    side = max(shape[0], shape[1])
    return "cifar" if side <= 32 else "tinyimagenet" if side <= 64 else "imagenet"


def pool(name_or_names: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """A corruption pool from a name in :data:`POOLS` or a list of corruption names (validated)."""
    names = POOLS.get(name_or_names) if isinstance(name_or_names, str) else tuple(name_or_names)
    if names is None:
        names = tuple(n for n in str(name_or_names).split(",") if n)
    bad = [n for n in names if n not in CORRUPTIONS]
    if bad or not names:
        raise InputError(f"unknown or empty corruption pool {name_or_names!r} (unknown: {bad}); "
                         f"use one of {', '.join(POOLS)} or names from: {', '.join(CORRUPTIONS)}")
    return names


# ---------------------------------------------------------------- helpers


def _gaussian(x: np.ndarray, sigma: float) -> np.ndarray:
    """scikit-image's Gaussian filter per channel (the reference's ``gaussian(..., multichannel)``)."""
    return filters.gaussian(x, sigma=sigma, channel_axis=-1 if x.ndim == 3 else None)


def _gauss_kernel_1d(ksize: int, sigma: float) -> np.ndarray:
    """OpenCV's ``getGaussianKernel(ksize, sigma)``: sampled, normalised Gaussian taps."""
    t = np.arange(ksize) - (ksize - 1) / 2
    k = np.exp(-(t**2) / (2 * sigma**2))
    return k / k.sum()


def _disk(radius: float, alias_blur: float) -> np.ndarray:
    """The reference's anti-aliased disk kernel (a 17x17 window for radius <= 8)."""
    half = 8 if radius <= 8 else int(radius)
    ksize = 3 if radius <= 8 else 5
    L = np.arange(-half, half + 1)
    X, Y = np.meshgrid(L, L)
    disk = ((X**2 + Y**2) <= radius**2).astype(np.float64)
    disk /= disk.sum()
    g = _gauss_kernel_1d(ksize, alias_blur)
    disk = ndimage.correlate1d(disk, g, axis=0, mode="mirror")
    return ndimage.correlate1d(disk, g, axis=1, mode="mirror")


def motion_blur_kernel(radius: float, sigma: float, angle: float) -> tuple[np.ndarray, np.ndarray]:
    """ImageMagick ``MotionBlurImage`` taps: weights (w,) and integer (dy, dx) offsets (w, 2).

    width w = 2*ceil(radius)+1, weight_i ∝ exp(-i^2 / (2 sigma^2)), offset_i = round(i *
    (sin a, cos a)) for i = 0..w-1 (a one-sided streak starting at the pixel itself).
    """
    width = int(2 * math.ceil(radius) + 1)
    i = np.arange(width, dtype=np.float64)
    w = np.exp(-(i**2) / (2.0 * sigma**2))
    w /= w.sum()
    a = math.radians(angle)
    off = np.stack([np.ceil(i * math.sin(a) - 0.5), np.ceil(i * math.cos(a) - 0.5)], axis=1).astype(int)
    return w, off


def _motion_blur(x: np.ndarray, radius: float, sigma: float, angle: float) -> np.ndarray:
    """Apply :func:`motion_blur_kernel` to (H, W) or (H, W, C) with edge pixels repeated."""
    w, off = motion_blur_kernel(radius, sigma, angle)
    h, wd = x.shape[:2]
    p = int(np.abs(off).max())
    pad = [(p, p), (p, p)] + [(0, 0)] * (x.ndim - 2)
    xp = np.pad(x, pad, mode="edge")
    out = np.zeros_like(x, dtype=np.float64)
    for wi, (dy, dx) in zip(w, off):
        out += wi * xp[p + dy : p + dy + h, p + dx : p + dx + wd]
    return out


def plasma_fractal(mapsize: int, wibbledecay: float, rng: np.random.Generator) -> np.ndarray:
    """Diamond-square height map (mapsize x mapsize, power of two) scaled to [0, 1] (fog's layer)."""
    if mapsize & (mapsize - 1):
        raise InputError(f"plasma_fractal needs a power-of-two size, got {mapsize}")
    m = np.zeros((mapsize, mapsize), dtype=np.float64)
    step = mapsize
    wibble = 100.0

    def wibbled_mean(a: np.ndarray) -> np.ndarray:
        return a / 4 + wibble * rng.uniform(-wibble, wibble, a.shape)

    while step >= 2:
        corner = m[0:mapsize:step, 0:mapsize:step]
        sq = corner + np.roll(corner, -1, axis=0)
        sq = sq + np.roll(sq, -1, axis=1)
        m[step // 2 : mapsize : step, step // 2 : mapsize : step] = wibbled_mean(sq)
        dr = m[step // 2 : mapsize : step, step // 2 : mapsize : step]
        ul = m[0:mapsize:step, 0:mapsize:step]
        lt = dr + np.roll(dr, 1, axis=0) + ul + np.roll(ul, -1, axis=1)
        m[0:mapsize:step, step // 2 : mapsize : step] = wibbled_mean(lt)
        tt = dr + np.roll(dr, 1, axis=1) + ul + np.roll(ul, -1, axis=0)
        m[step // 2 : mapsize : step, 0:mapsize:step] = wibbled_mean(tt)
        step //= 2
        wibble /= wibbledecay
    m -= m.min()
    return m / m.max()


def _clipped_zoom(x: np.ndarray, z: float) -> np.ndarray:
    """Zoom the centre of (H, W, C) by ``z`` (bilinear) and crop back to (H, W, C)."""
    h, w = x.shape[:2]
    ch, cw = int(np.ceil(h / z)), int(np.ceil(w / z))
    top, left = (h - ch) // 2, (w - cw) // 2
    out = ndimage.zoom(x[top : top + ch, left : left + cw], (z, z, 1), order=1)
    th, tw = (out.shape[0] - h) // 2, (out.shape[1] - w) // 2
    return out[th : th + h, tw : tw + w]


def _rgb_op(x: np.ndarray, op: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Run an RGB-only operation; a single channel is replicated and returned as luma."""
    if x.shape[2] == 3:
        return op(x)
    return (op(np.repeat(x, 3, axis=2)) @ _LUMA)[..., None]


def frost_layer(h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """Procedural frost overlay (H, W, 3) in [0, 255] (substitute for the reference's photos).

    A plasma-fractal haze (brightness 0.25-0.65) plus thin needle crystals: short anti-aliased
    line segments at random angles, a few per 64 px^2, some branching off others, softened by a
    Gaussian of 0.5 px; tinted pale ice blue (0.82, 0.9, 1.0). The photos it replaces are bright
    crystalline textures of similar mean brightness (about 0.5 after the reference's crop).
    """
    side = 1 << max(int(np.ceil(np.log2(max(h, w, 2)))), 1)
    haze = 0.25 + 0.4 * plasma_fractal(side, 2.0, rng)[:h, :w]
    needles = np.zeros((h, w))
    n = max(6, int(h * w / 64))
    scale = max(h, w)
    for _ in range(n):
        r0, c0 = rng.uniform(0, h), rng.uniform(0, w)
        for _branch in range(int(rng.integers(1, 4))):
            ang = rng.uniform(0, np.pi)
            length = rng.uniform(0.05, 0.25) * scale
            r1, c1 = r0 + length * np.sin(ang), c0 + length * np.cos(ang)
            rr, cc, val = draw.line_aa(int(r0), int(c0), int(r1), int(c1))
            keep = (rr >= 0) & (rr < h) & (cc >= 0) & (cc < w)
            needles[rr[keep], cc[keep]] = np.maximum(needles[rr[keep], cc[keep]], val[keep] * rng.uniform(0.5, 1))
            t = rng.uniform(0.3, 1.0)
            r0, c0 = r0 + t * (r1 - r0), c0 + t * (c1 - c0)
    needles = filters.gaussian(needles, sigma=0.5)
    intensity = np.clip(haze + 0.8 * needles, 0, 1)
    return intensity[..., None] * np.array([0.82, 0.9, 1.0]) * 255.0


# ---------------------------------------------------------------- corruptions
# each takes x: float64 (H, W, C) in [0, 1], the constant c, rng, and returns float in ~[0, 1]


def _gaussian_noise(x, c, rng):
    return x + rng.normal(scale=c, size=x.shape)


def _shot_noise(x, c, rng):
    return rng.poisson(x * c) / c


def _impulse_noise(x, c, rng):
    # scikit-image's random_noise(mode="s&p", amount=c): each value flips with prob c, half to 1
    out = x.copy()
    flip = rng.random(x.shape) <= c
    salt = rng.random(x.shape) <= 0.5
    out[flip & salt] = 1.0
    out[flip & ~salt] = 0.0
    return out


def _speckle_noise(x, c, rng):
    return x + x * rng.normal(scale=c, size=x.shape)


def _gaussian_blur(x, c, rng):
    return _gaussian(x, c)


def _glass_blur(x, c, rng):
    sigma, delta, iterations = c
    img = np.uint8(np.clip(_gaussian(x, sigma), 0, 1) * 255)
    h, w = img.shape[:2]
    rows = range(h - delta, delta, -1)
    cols = range(w - delta, delta, -1)
    for _ in range(iterations):
        d = rng.integers(-delta, delta, size=(len(rows), len(cols), 2))
        for i, r in enumerate(rows):
            for j, q in enumerate(cols):
                dx, dy = d[i, j]
                img[r, q] = img[r + dy, q + dx]
    return _gaussian(img / 255.0, sigma)


def _defocus_blur(x, c, rng):
    k = _disk(c[0], c[1])
    return np.stack([ndimage.correlate(x[..., d], k, mode="mirror") for d in range(x.shape[2])], axis=2)


def _motion_blur_op(x, c, rng):
    img = np.rint(np.clip(x, 0, 1) * 255)  # the reference blurs the 8-bit PNG
    return _motion_blur(img, c[0], c[1], rng.uniform(-45, 45)) / 255.0


def _zoom_blur(x, c, rng):
    x = x.astype(np.float32)
    out = np.zeros_like(x)
    for z in c:
        out += _clipped_zoom(x, float(z))
    return (x + out) / (len(c) + 1)


def _fog(x, c, rng):
    h, w = x.shape[:2]
    side = 1 << int(np.ceil(np.log2(max(h, w))))
    max_val = x.max()
    x = x + c[0] * plasma_fractal(side, c[1], rng)[:h, :w, None]
    return x * max_val / (max_val + c[0])


#: the references' frost photo scale per preset (make_cifar_c 0.2, make_tinyimagenet_c 0.3, ImageNet-C 1;
#: imagecorruptions: 1.1 x the fit, see :func:`_scaled_photo`)
_FROST_SCALE = {"cifar": 0.2, "tinyimagenet": 0.3, "imagenet": 1.0, "imagecorruptions": None}


@functools.lru_cache(maxsize=1)
def frost_photos() -> tuple[np.ndarray, ...] | None:
    """The six reference frost photos (RGB uint8) from the installed ``imagecorruptions`` wheel, or
    None when it is not installed. The package is located, never imported (its import loads OpenCV)."""
    spec = importlib.util.find_spec("imagecorruptions")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / "frost"
    files = [folder / f for f in ("frost1.png", "frost2.png", "frost3.png", "frost4.jpg", "frost5.jpg", "frost6.jpg")]
    if not all(f.is_file() for f in files):
        return None
    out = []
    for f in files:
        with Image.open(f) as im:
            out.append(np.asarray(im.convert("RGB"), dtype=np.uint8))
    return tuple(out)


def frost_source() -> str:
    """Which frost overlay :func:`corrupt` uses here: the reference photos or the procedural stand-in."""
    if frost_photos() is None:
        return "procedural (imagecorruptions not installed)"
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"photos (imagecorruptions {version('imagecorruptions')})"
    except PackageNotFoundError:
        return "photos (imagecorruptions)"


@functools.lru_cache(maxsize=64)
def _scaled_photo(index: int, scale: float | None, h: int, w: int) -> np.ndarray:
    """Photo ``index`` scaled for an h x w image.

    ``scale=None`` is imagecorruptions': always 1.1 x max(1, h / ph, w / pw) (a photo at least as
    large as the image is still enlarged 1.1x). A number is the Hendrycks references' fixed factor;
    where the photo so scaled would be smaller than the image (never at their native 32 / 64 / 224
    px) it is enlarged to 1.1 x the fit instead, oodeval's extension."""
    photo = frost_photos()[index]
    ph, pw = photo.shape[:2]
    if scale is None:
        scale = 1.1 * max(1.0, h / ph, w / pw)
    elif ph * scale < h or pw * scale < w:
        scale = 1.1 * max(h / ph, w / pw)
    size = (max(w + 1, int(np.ceil(pw * scale))), max(h + 1, int(np.ceil(ph * scale))))
    if size == (pw, ph):
        return photo
    return np.asarray(Image.fromarray(photo).resize(size, Image.Resampling.BICUBIC))


def _frost_photo_crop(h: int, w: int, preset: str, rng: np.random.Generator) -> np.ndarray | None:
    if frost_photos() is None:
        return None
    big = _scaled_photo(int(rng.integers(5)), _FROST_SCALE[preset], h, w)
    top, left = int(rng.integers(big.shape[0] - h)), int(rng.integers(big.shape[1] - w))
    return big[top : top + h, left : left + w].astype(np.float64)


def _frost(x, c, rng, preset="imagenet"):
    h, w = x.shape[:2]
    photo = _frost_photo_crop(h, w, preset, rng)
    f = (frost_layer(h, w, rng) if photo is None else photo) / 255.0
    if x.shape[2] == 1:
        f = (f @ _LUMA)[..., None]
    return c[0] * x + c[1] * f


def _snow(x, c, rng):
    h, w = x.shape[:2]
    layer = rng.normal(loc=c[0], scale=c[1], size=(h, w))
    layer = _clipped_zoom(layer[..., None], c[2])[..., 0]
    layer[layer < c[3]] = 0
    layer = np.clip(layer, 0, 1)
    layer = np.rint(layer * 255).astype(np.uint8).astype(np.float64)  # the reference's 8-bit PNG
    layer = _motion_blur(layer, c[4], c[5], rng.uniform(-135, -45)) / 255.0
    layer = layer[..., None]
    gray = x @ _LUMA if x.shape[2] == 3 else x[..., 0]
    x = c[6] * x + (1 - c[6]) * np.maximum(x, gray[..., None] * 1.5 + 0.5)
    return x + layer + np.rot90(layer, k=2)


def _equalize_hist(u8: np.ndarray) -> np.ndarray:
    """OpenCV's ``equalizeHist``: lut = round((cdf - cdf[first used bin]) * 255 / (n - that count))."""
    hist = np.bincount(u8.ravel(), minlength=256)
    first = hist[np.flatnonzero(hist)[0]]
    if first == u8.size:
        return u8.copy()
    lut = np.rint((np.cumsum(hist) - first) * 255.0 / (u8.size - first))
    return np.clip(lut, 0, 255).astype(np.uint8)[u8]


def _spatter(x, c, rng):
    h, w = x.shape[:2]
    liquid = filters.gaussian(rng.normal(loc=c[0], scale=c[1], size=(h, w)), sigma=c[2])
    liquid[liquid < c[3]] = 0
    if c[5] == 0:  # water: turquoise drops with a relief shading from distances to their edges
        u8 = np.clip(liquid * 255, 0, 255).astype(np.uint8)
        edges = feature.canny(u8.astype(np.float64), sigma=0.5, low_threshold=50, high_threshold=150)
        dist = np.full((h, w), 20.0) if not edges.any() else np.minimum(ndimage.distance_transform_edt(~edges), 20)
        dist = _equalize_hist(ndimage.uniform_filter(dist, 3, mode="mirror").astype(np.uint8))
        ker = np.array([[-2, -1, 0], [-1, 1, 1], [0, 1, 2]], dtype=np.float64)
        dist = np.clip(np.rint(ndimage.correlate(dist.astype(np.float64), ker, mode="mirror")), 0, 255)
        dist = ndimage.uniform_filter(dist, 3, mode="mirror")
        m = liquid * dist
        m = m / m.max() * c[4] if m.max() > 0 else m
        tint = np.array([175, 238, 238]) / 255.0
        tint = tint if x.shape[2] == 3 else np.array([tint @ _LUMA])
        return x + m[..., None] * tint
    # mud: brown blobs replacing the image
    m = filters.gaussian((liquid > c[3]).astype(np.float64), sigma=c[4])
    m[m < 0.8] = 0
    mud = np.array([63, 42, 20]) / 255.0
    mud = mud if x.shape[2] == 3 else np.array([mud @ _LUMA])
    return x * (1 - m[..., None]) + m[..., None] * mud


def _contrast(x, c, rng):
    means = x.mean(axis=(0, 1), keepdims=True)
    return (x - means) * c + means


def _brightness(x, c, rng):
    def op(rgb):
        hsv = color.rgb2hsv(rgb)
        hsv[..., 2] = np.clip(hsv[..., 2] + c, 0, 1)
        return color.hsv2rgb(hsv)

    return _rgb_op(x, op)


def _saturate(x, c, rng):
    def op(rgb):
        hsv = color.rgb2hsv(rgb)
        hsv[..., 1] = np.clip(hsv[..., 1] * c[0] + c[1], 0, 1)
        return color.hsv2rgb(hsv)

    return _rgb_op(x, op)


def _to_pil(x: np.ndarray) -> Image.Image:
    u8 = np.rint(np.clip(x, 0, 1) * 255).astype(np.uint8)
    return Image.fromarray(u8[..., 0] if u8.shape[2] == 1 else u8)


def _from_pil(im: Image.Image, channels: int) -> np.ndarray:
    a = np.asarray(im, dtype=np.float64) / 255.0
    return a[..., None] if a.ndim == 2 else a[..., :channels]


def _jpeg_compression(x, c, rng):
    buf = io.BytesIO()
    _to_pil(x).save(buf, "JPEG", quality=int(c))
    buf.seek(0)
    return _from_pil(Image.open(buf), x.shape[2])


def _pixelate(x, c, rng):
    h, w = x.shape[:2]
    im = _to_pil(x).resize((max(1, int(w * c)), max(1, int(h * c))), Image.Resampling.BOX)
    return _from_pil(im.resize((w, h), Image.Resampling.BOX), x.shape[2])


def _elastic_transform(x, c, rng):
    h, w = x.shape[:2]
    side = min(h, w)
    # geometric similarity across sizes: smoothing and jitter scale with the side r = side/ref,
    # the displacement (alpha / sigma) too, so alpha scales with r^2 (exact at the reference size)
    alpha, sigma, jitter = c[0] * side * side / c[3], c[1] * side, c[2] * side
    # random affine: three points around the centre, each moved by U(-jitter, jitter) (x, y order)
    centre = np.array([w // 2, h // 2], dtype=np.float64)
    sq = side // 3
    src = np.array([centre + sq, [centre[0] + sq, centre[1] - sq], centre - sq])
    dst = src + rng.uniform(-jitter, jitter, size=src.shape)
    tform = transform.AffineTransform.from_estimate(src, dst)
    x = transform.warp(x, tform.inverse, order=1, mode="reflect", preserve_range=True)
    if alpha > 0 and sigma > 0:
        dx = filters.gaussian(rng.uniform(-1, 1, size=(h, w)), sigma, mode="reflect", truncate=3) * alpha
        dy = filters.gaussian(rng.uniform(-1, 1, size=(h, w)), sigma, mode="reflect", truncate=3) * alpha
        rr, cc = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        coords = [rr + dy, cc + dx]
        x = np.stack(
            [ndimage.map_coordinates(x[..., d], coords, order=1, mode="reflect") for d in range(x.shape[2])], axis=2
        )
    return x


def elastic_displacement(h: int, w: int, alpha: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """imagecorruptions' elastic displacement field (dy, dx) in pixels for an h x w image:
    ``alpha * gaussian(U(-m, m), sigma=(0.01 h, 0.01 w), reflect, truncate 3)`` with m = 0.005 h
    for both axes (its ``max_dx = max_dy = shape[0] * 0.005``), dx drawn first."""
    m = 0.005 * h
    sigma = (0.01 * h, 0.01 * w)
    dx = filters.gaussian(rng.uniform(-m, m, size=(h, w)), sigma=sigma, mode="reflect", truncate=3) * alpha
    dy = filters.gaussian(rng.uniform(-m, m, size=(h, w)), sigma=sigma, mode="reflect", truncate=3) * alpha
    return dy, dx


def _elastic_imagecorruptions(x, alpha, rng):
    h, w = x.shape[:2]
    dy, dx = elastic_displacement(h, w, alpha, rng)
    rr, cc = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    coords = [rr + dy, cc + dx]
    return np.stack([ndimage.map_coordinates(x[..., d], coords, order=1, mode="reflect") for d in range(x.shape[2])], axis=2)


_OPS: dict[str, Callable[[np.ndarray, object, np.random.Generator], np.ndarray]] = {
    "gaussian_noise": _gaussian_noise,
    "shot_noise": _shot_noise,
    "impulse_noise": _impulse_noise,
    "speckle_noise": _speckle_noise,
    "gaussian_blur": _gaussian_blur,
    "glass_blur": _glass_blur,
    "defocus_blur": _defocus_blur,
    "motion_blur": _motion_blur_op,
    "zoom_blur": _zoom_blur,
    "fog": _fog,
    "frost": _frost,
    "snow": _snow,
    "contrast": _contrast,
    "brightness": _brightness,
    "saturate": _saturate,
    "spatter": _spatter,
    "jpeg_compression": _jpeg_compression,
    "pixelate": _pixelate,
    "elastic_transform": _elastic_transform,
}


def corrupt(
    image: np.ndarray, name: str, severity: int, rng: np.random.Generator, preset: str = "auto"
) -> np.ndarray:
    """Corrupt one uint8 image (H, W) or (H, W, C), C in {1, 3}, with ``name`` at ``severity`` 1-5.

    ``preset``: "auto" (:func:`preset_for`: CIFAR-10-C up to 32 px, Tiny-ImageNet-C up to 64 px,
    ImageNet-C above), "cifar", "tinyimagenet", "imagenet" or "imagecorruptions" (the package the
    CnC release ran: ImageNet-C's constants with its own elastic transform and frost scaling). Returns uint8 of the input's shape (values rounded and clipped to 0-255).
    """
    img = np.asarray(image)
    if img.dtype != np.uint8:
        raise InputError(f"corrupt expects a uint8 image, got dtype {img.dtype}")
    if img.ndim not in (2, 3) or (img.ndim == 3 and img.shape[2] not in (1, 3)):
        raise InputError(f"corrupt expects (H, W), (H, W, 1) or (H, W, 3), got shape {img.shape}")
    if min(img.shape[:2]) < 4:
        raise InputError(f"image of {img.shape[0]}x{img.shape[1]} px is too small to corrupt (min 4)")
    if name not in _OPS:
        raise InputError(f"unknown corruption {name!r}; known ({len(CORRUPTIONS)}): {', '.join(CORRUPTIONS)}")
    if int(severity) != severity or not 1 <= severity <= 5:
        raise InputError(f"severity must be an integer 1-5, got {severity!r}")
    if preset == "auto":
        preset = preset_for(img.shape)
    if preset not in PRESETS:
        raise InputError(f"unknown preset {preset!r}; use 'auto' or one of {', '.join(PRESETS)}")
    x = img.astype(np.float64) / 255.0
    if x.ndim == 2:
        x = x[..., None]
    c = _C[preset][name][int(severity) - 1]
    if name == "frost":
        out = _frost(x, c, rng, preset)
    elif name == "elastic_transform" and preset == "imagecorruptions":
        out = _elastic_imagecorruptions(x, c, rng)
    else:
        out = _OPS[name](x, c, rng)
    out = np.rint(np.clip(np.asarray(out, dtype=np.float64), 0, 1) * 255).astype(np.uint8)
    return out.reshape(img.shape)
