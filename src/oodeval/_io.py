"""Atomic file writes and content hashing shared by every store in oodeval."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np


@contextmanager
def atomic_path(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; on success it replaces ``target`` in one rename.

    Works for files and folders: whatever the body writes at the yielded path is moved into
    place only when the body finishes, so a crash never leaves a half-written ``target``.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    work = tmp / "payload"
    try:
        yield work
        if target.is_dir() and not target.is_symlink():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
            os.replace(work, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(work, target)
        _fsync_dir(target.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(target: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``target`` atomically."""
    with atomic_path(target) as tmp:
        tmp.write_text(text)


def write_json_atomic(target: str | os.PathLike, obj: object) -> None:
    """Write ``obj`` as indented, key-sorted JSON to ``target`` atomically."""
    write_text_atomic(target, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def save_npy_atomic(target: str | os.PathLike, arr: np.ndarray) -> None:
    """``np.save`` ``arr`` to ``target`` atomically (the exact path, no ``.npy`` appended)."""
    with atomic_path(target) as tmp, open(tmp, "wb") as fh:
        np.save(fh, np.ascontiguousarray(arr))


def hash_arrays(arrays: dict[str, np.ndarray], chunk_rows: int = 65536) -> str:
    """blake2b over names, dtypes, shapes and bytes of the arrays (chunked, works on memmaps)."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(arrays):
        a = arrays[name]
        h.update(f"{name}|{a.dtype.str}|{a.shape}".encode())
        if a.ndim == 0:
            h.update(np.ascontiguousarray(a).tobytes())
            continue
        for start in range(0, a.shape[0], chunk_rows):
            h.update(np.ascontiguousarray(a[start : start + chunk_rows]).tobytes())
    return h.hexdigest()


def hash_json(obj: object) -> str:
    """Stable short hash of a JSON-serialisable object."""
    return hashlib.blake2b(json.dumps(obj, sort_keys=True, default=str).encode(), digest_size=16).hexdigest()
