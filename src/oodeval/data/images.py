"""Image loading: files through PIL, and images inside container files addressed as ``FILE#K``.

Containers understood: IDX files (``*-idx3-ubyte`` optionally ``.gz``; LeCun's format, used by
MNIST and Fashion-MNIST). An unreadable image raises :class:`ImageError` naming path and cause;
the extractor catches it, skips the row and lists it in the FeatureSet metadata. PIL (the
``models`` extra) loads on the first image read, so importing ``oodeval.data`` needs no extra.
"""

from __future__ import annotations

import gzip
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .._extras import needs
from ..errors import InputError, OodevalError

if TYPE_CHECKING:
    from PIL import Image

__all__ = ["ImageError", "open_image", "read_idx"]

_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


class ImageError(OodevalError):
    """An image that cannot be read or decoded."""


@lru_cache(maxsize=8)
def read_idx(path: str) -> np.ndarray:
    """Read an IDX file (optionally gzipped) into an array of its stored shape (LeCun et al.)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as fh:
        data = fh.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise InputError(f"{path} is not an IDX file (bad magic number)")
    ndim = data[3]
    dims = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    arr = np.frombuffer(data, dtype=_IDX_DTYPES[data[2]], offset=4 + 4 * ndim)
    if arr.size != int(np.prod(dims)):
        raise InputError(f"{path}: header says {dims} = {int(np.prod(dims))} values, file holds {arr.size}")
    return arr.reshape(dims)


def _pil():
    """PIL's ``Image`` module (``ModuleNotFoundError`` naming the extra when it is missing)."""
    with needs():
        from PIL import Image
    return Image


def _open_member(container: str, key: str) -> Image.Image:
    name = Path(container).name
    if "-idx" in name and "-ubyte" in name:
        arr = read_idx(container)
        k = int(key)
        if not 0 <= k < arr.shape[0]:
            raise ImageError(f"{container}#{key}: index outside 0..{arr.shape[0] - 1}")
        return _pil().fromarray(np.ascontiguousarray(arr[k]).astype(np.uint8))
    raise ImageError(f"{container}#{key}: unknown container format (known: IDX '*-idx3-ubyte[.gz]')")


def open_image(path: str, mode: str = "RGB") -> Image.Image:
    """Decode the image at ``path`` (a file, or ``FILE#K`` inside a container) fully, in ``mode``.

    The pixels are decoded here (not lazily), so a truncated or corrupt file raises
    :class:`ImageError` now rather than later inside a transform.
    """
    Image = _pil()
    try:
        if "#" in path and not Path(path).exists():
            container, key = path.rsplit("#", 1)
            img = _open_member(container, key)
        else:
            with Image.open(path) as im:
                im.load()  # decoded now; the image stays valid after the file is closed
            img = im
        return img if img.mode == mode else img.convert(mode)
    except ImageError:
        raise
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise ImageError(f"{path}: {type(exc).__name__}: {exc}") from exc
