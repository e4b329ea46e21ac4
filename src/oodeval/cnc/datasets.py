"""uint8 image arrays for CnC training and evaluation, from any dataset oodeval can name.

``load_arrays(spec)`` accepts a ``.npz`` file (arrays ``images`` (N, H, W[, C]) uint8 and
optional ``labels``), or anything :func:`oodeval.data.resolve` accepts: a registry name
(``NAME:SPLIT`` picks a split, e.g. ``cifar10:train``), a user dataset under the data root,
an image folder or a CSV manifest. Images are decoded with :func:`oodeval.data.open_image`,
in grey (1 channel) or RGB (3 channels), optionally resized to ``size`` x ``size`` (bilinear);
all images must end up the same size. An unreadable image is skipped and listed in
``info["skipped"]`` (index, path, error), as ``oodeval extract`` does; ``--channels`` (``channels``)
converts decoded images only, never ``.npz`` arrays. A broken ``.npz`` is a ValueError naming it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..data import ImageError, open_image, resolve
from ..errors import InputError

__all__ = ["load_arrays", "resize_arrays"]


def resize_arrays(images: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Every uint8 image resized to ``size`` = (H, W), bilinear (PIL), channels kept."""
    from PIL import Image

    h, w = size
    out = []
    for a in np.asarray(images):
        im = Image.fromarray(a[..., 0] if a.ndim == 3 and a.shape[2] == 1 else a)
        r = np.asarray(im.resize((w, h), Image.Resampling.BILINEAR), dtype=np.uint8)
        out.append(r[..., None] if a.ndim == 3 and a.shape[2] == 1 else r)
    return np.stack(out)


def _native_channels(m) -> int:
    """The channels of the first readable image of manifest ``m`` (IDX container members are grey)."""
    from PIL import Image

    for i in range(len(m)):
        path = m.resolve_path(i)
        if "#" in path and not Path(path).exists():
            return 1
        try:
            with Image.open(path) as im:
                return 1 if im.mode in ("1", "L", "LA", "I", "I;16", "F") else 3
        except (OSError, ValueError):
            continue
    raise InputError(f"dataset {m.name!r}: none of its {len(m)} images is readable")


def load_arrays(
    spec: str | os.PathLike,
    data_root: str | os.PathLike | None = None,
    channels: int | None = None,
    size: int | None = None,
    strict: bool = True,
    progress: bool = True,
) -> tuple[np.ndarray, np.ndarray, dict]:
    """(images uint8 (N, H, W) or (N, H, W, 3), labels int64 (N,) with -1 = unknown, info).

    ``channels``: 1 (grey) or 3 (RGB); default: the first image's own mode. ``info`` holds the
    dataset name, class names when known and the source.
    """
    from tqdm.auto import tqdm

    if channels not in (None, 1, 3):
        raise InputError(f"channels must be 1 or 3, got {channels}")
    path = Path(spec)
    if path.suffix == ".npz" and path.is_file():
        try:
            with np.load(path, allow_pickle=False) as z:
                if "images" not in z:
                    raise KeyError(f"no 'images' array (found: {', '.join(z.files) or 'none'})")
                images = np.asarray(z["images"])
                labels = np.asarray(z["labels"], dtype=np.int64) if "labels" in z else np.full(len(images), -1, np.int64)
        except (OSError, ValueError, KeyError, EOFError, TypeError) as exc:
            msg = exc.args[0] if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
            raise InputError(f"{path}: not a readable .npz of images and labels ({msg})") from None
        if images.dtype != np.uint8 or images.ndim not in (3, 4):
            raise InputError(f"{path}: images must be uint8 (N, H, W[, C]), got {images.dtype} {images.shape}")
        if labels.shape != (len(images),):
            raise InputError(f"{path}: {len(images)} images but labels of shape {labels.shape}")
        return images, labels, {"name": path.stem, "source": str(path), "format": "npz", "skipped": []}

    from PIL import Image


    m = resolve(spec, data_root, strict=strict)
    if len(m) == 0:
        raise InputError(f"dataset {spec!r} has no images")
    chans = channels or _native_channels(m)
    mode = "L" if chans == 1 else "RGB"
    out, kept, skipped = [], [], []
    for i in tqdm(range(len(m)), desc=f"reading {spec}", unit="img", disable=not progress, leave=False):
        try:
            im = open_image(m.resolve_path(i), mode)
        except ImageError as exc:
            skipped.append({"index": i, "path": m.resolve_path(i), "error": str(exc)})
            continue
        if size is not None and im.size != (size, size):
            im = im.resize((size, size), Image.Resampling.BILINEAR)
        out.append(np.asarray(im, dtype=np.uint8))
        kept.append(i)
    if not out:
        raise InputError(f"dataset {spec!r}: none of its {len(m)} images is readable (first: {skipped[0]['error']})")
    shapes = {a.shape for a in out}
    if len(shapes) > 1:
        raise InputError(f"dataset {spec!r} has images of {len(shapes)} sizes ({sorted(shapes)[:3]} ...); pass size=")
    info = {"name": m.name, "source": str(spec), "class_names": m.class_names, "format": "images", "skipped": skipped}
    return np.stack(out), np.asarray(m.labels, dtype=np.int64)[kept], info
