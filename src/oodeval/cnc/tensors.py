"""uint8 image batches to the normalised float32 tensors the CnC model trains and is evaluated on
(torch loads on the first call). Training, the loader and the outlier batches share it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..errors import InputError

__all__ = ["to_tensor"]


def to_tensor(images: np.ndarray, mean: Sequence[float] = (0.5,), std: Sequence[float] = (0.5,)):
    """uint8 (N, H, W[, C]) -> float32 torch (N, C, H, W), (x/255 - mean) / std per channel."""
    a = np.asarray(images)
    if a.ndim == 3:
        a = a[..., None]
    if a.ndim != 4:
        raise InputError(f"images must be (N, H, W) or (N, H, W, C), got shape {a.shape}")
    t = torch.from_numpy(np.ascontiguousarray(a)).permute(0, 3, 1, 2).float().div_(255.0)
    m = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    return (t - m) / s
