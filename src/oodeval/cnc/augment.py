"""The CnC release's input augmentations, on uint8 (H, W[, C]) numpy images with a given Generator.

``cnc-ood/cnc_ood`` ``datasets/cifar10.py``: ID images get ``RandomCrop(32, padding=4)`` +
``RandomHorizontalFlip`` (:func:`crop_flip`); outlier sources additionally get
``RandomVerticalFlip`` + ``RandomRotation(15)`` (:func:`release_source`) before CutMix and the
corruption. As torchvision does: zero padding, flips with probability 1/2, the angle uniform in
[-15, 15] degrees, nearest-neighbour rotation about the centre with black fill.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

__all__ = ["crop_flip", "release_source", "AUGMENTS"]


def _crop_flip_one(img: np.ndarray, rng: np.random.Generator, pad: int) -> np.ndarray:
    h, w = img.shape[:2]
    padded = np.pad(img, [(pad, pad), (pad, pad)] + [(0, 0)] * (img.ndim - 2))
    top, left = int(rng.integers(2 * pad + 1)), int(rng.integers(2 * pad + 1))
    out = padded[top : top + h, left : left + w]
    return out[:, ::-1] if rng.random() < 0.5 else out


def crop_flip(images: np.ndarray, rng: np.random.Generator, pad: int = 4) -> np.ndarray:
    """Random crop of the zero-padded image (``pad`` px each side) and horizontal flip, per image."""
    return np.stack([_crop_flip_one(im, rng, pad) for im in images])


def release_source(img: np.ndarray, rng: np.random.Generator, pad: int = 4, degrees: float = 15.0) -> np.ndarray:
    """One outlier source image: crop + horizontal flip, vertical flip, rotation in [-15, 15] degrees."""
    out = _crop_flip_one(img, rng, pad)
    if rng.random() < 0.5:
        out = out[::-1]
    angle = rng.uniform(-degrees, degrees)
    return ndimage.rotate(out, angle, axes=(1, 0), reshape=False, order=0, mode="constant", cval=0)


#: ID augmentations by config name
AUGMENTS = {"none": None, "crop_flip": crop_flip}
