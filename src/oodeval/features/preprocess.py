"""Split a model's eval transform into its PIL part (per image, in the loader) and its tensor tail.

timm and open_clip eval transforms end in ``ToTensor`` + ``Normalize``. Running those two per
image costs far more than they compute (many tiny tensor ops), so the loader applies only the
PIL part (resize, crop, mode) and returns uint8 HWC arrays; the batch is then converted on the
device: ``x = (uint8 / 255 - mean) / std`` in float32 - the same elementwise operations, in the
same order, as ``ToTensor`` then ``Normalize``, so the result is bit-identical (tested). A
transform of any other shape is applied whole, per image.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from .._extras import optional

__all__ = ["SplitTransform", "split_transform"]


@dataclass
class SplitTransform:
    """``pil`` maps a PIL image to a uint8 (H, W, C) array; ``mean``/``std`` finish on the device."""

    pil: Callable
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __call__(self, img) -> np.ndarray:
        arr = np.asarray(self.pil(img), dtype=np.uint8)
        return arr[:, :, None] if arr.ndim == 2 else arr

    def finish(self, batch: torch.Tensor, channels_last: bool = False) -> torch.Tensor:
        """uint8 (B, H, W, C) on any device -> normalised float32 (B, C, H, W)."""
        x = batch.permute(0, 3, 1, 2).float().div_(255)  # in place after the one float copy
        mean = torch.as_tensor(self.mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
        std = torch.as_tensor(self.std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
        x = x.sub_(mean).div_(std)
        return x.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


def split_transform(transform: Callable) -> SplitTransform | None:
    """A :class:`SplitTransform` if ``transform`` is ``Compose([..PIL ops.., ToTensor, Normalize])``, else None."""
    T = optional("torchvision.transforms")

    steps = getattr(transform, "transforms", None)
    if not isinstance(transform, T.Compose) or not steps or len(steps) < 2:
        return None
    to_tensor, norm = steps[-2], steps[-1]
    if type(to_tensor).__name__ not in ("ToTensor", "MaybeToTensor") or not isinstance(norm, T.Normalize) or norm.inplace:
        return None
    if any(isinstance(s, (T.ToTensor, T.PILToTensor, T.Normalize)) for s in steps[:-2]):
        return None
    mean = tuple(float(v) for v in torch.as_tensor(norm.mean).reshape(-1))
    std = tuple(float(v) for v in torch.as_tensor(norm.std).reshape(-1))
    return SplitTransform(T.Compose(list(steps[:-2])), mean, std)
