"""Row chunks of (memory-mapped) FeatureSet arrays, read without growing the process's memory with N.

A FeatureSet loaded from disk holds ``np.memmap`` arrays; slicing them and touching the pages keeps
those pages resident in the process (RSS grows to the whole file over a pass). ``read_rows`` reads a
chunk of a whole-file ``.npy`` memmap with ordinary file reads instead (the pages stay in the OS
page cache, not in the process), so a pass over N rows holds one chunk at a time. Any other array
(in memory, or a memmap view that is not a whole file) is sliced.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..errors import InputError

__all__ = ["read_rows", "iter_chunks"]


def _npy_data_offset(arr: np.ndarray) -> int | None:
    """Byte offset of the data in ``arr``'s .npy file when ``arr`` is that whole file, memory-mapped; else None."""
    filename = getattr(arr, "filename", None)
    if not isinstance(arr, np.memmap) or not filename or not arr.flags.c_contiguous:
        return None
    with open(filename, "rb") as fh:
        try:
            major, _ = np.lib.format.read_magic(fh)
        except ValueError:
            return None
        read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(fh)
        offset = fh.tell()
    if fortran or tuple(shape) != arr.shape or dtype != arr.dtype:
        return None
    return offset


def read_rows(arr: np.ndarray, start: int, stop: int, offset: int | None = None) -> np.ndarray:
    """Rows ``start:stop`` of ``arr`` as an in-memory array (file reads for a whole-file memmap at ``offset``)."""
    if offset is None:
        return np.array(arr[start:stop])
    row = int(np.prod(arr.shape[1:], dtype=np.int64))
    with open(arr.filename, "rb") as fh:
        fh.seek(offset + start * row * arr.dtype.itemsize)
        out = np.fromfile(fh, dtype=arr.dtype, count=(stop - start) * row)
    return out.reshape((stop - start, *arr.shape[1:]))


def iter_chunks(arrays: dict[str, np.ndarray], rows: int) -> Iterator[tuple[slice, dict[str, np.ndarray]]]:
    """``(row slice, {name: rows of that array})`` over consecutive chunks of ``rows`` rows (same first axis)."""
    n = {a.shape[0] for a in arrays.values()}
    if len(n) != 1:
        raise InputError(f"arrays have different numbers of rows: {sorted(n)}")
    total = n.pop()
    offsets = {name: _npy_data_offset(a) for name, a in arrays.items()}
    step = max(1, int(rows))
    for start in range(0, total, step):
        stop = min(total, start + step)
        yield slice(start, stop), {name: read_rows(a, start, stop, offsets[name]) for name, a in arrays.items()}
