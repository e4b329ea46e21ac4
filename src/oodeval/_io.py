"""Safe atomic outputs and content hashing shared by every writer in oodeval.

The output rules (one place for every command and save function):

- A *file* output is written beside its target and renamed into place. An existing file at the
  target is replaced only when ``is_own`` recognises it as oodeval's own output of the same kind
  (its header, keys or schema); a folder, a symbolic link or any other file is refused.
- A *folder* output carries the marker file ``.oodeval-output.json`` naming its kind. An existing
  folder is replaced (or written into) only when it carries the marker of the same kind (or
  ``is_own`` recognises an older oodeval folder of that kind), and a replaced folder must hold
  nothing but the files oodeval wrote there; an empty folder is taken as it is. Anything else
  is refused with :class:`OutputPathError` before any work is done, and checked again just
  before the rename.

Written files and folders get the user's normal mode (the umask), never a temporary file's 0600.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .errors import InputError

MARKER = ".oodeval-output.json"
Recogniser = Callable[[Path], bool]


class OutputPathError(FileExistsError, InputError):
    """An output path oodeval refuses to write because it would replace what oodeval did not create."""


def marker_kind(folder: str | os.PathLike) -> str | None:
    """The kind recorded in ``folder``'s oodeval marker, or None when it has none (or an unreadable one)."""
    try:
        return str(json.loads((Path(folder) / MARKER).read_text())["kind"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _refuse(target: Path, what: str, kind: str) -> OutputPathError:
    return OutputPathError(
        f"{target} {what}; oodeval replaces only its own {kind} output and never deletes anything else. "
        f"Choose another output path, or move or remove {target} yourself"
    )


def check_output(target: str | os.PathLike, kind: str | None, *, folder: bool = False, is_own: Recogniser | None = None) -> Path:
    """Raise :class:`OutputPathError` unless writing ``target`` replaces only oodeval's own output of ``kind``.

    ``kind=None`` is an internal file inside a folder oodeval owns: an existing file there is
    replaced, an existing folder is refused. Returns ``target`` as a Path; nothing is touched.
    """
    target = Path(target)
    label = kind or "file"
    if target.is_symlink():
        raise _refuse(target, "is a symbolic link", label)
    if not target.exists():
        return target
    if folder:
        if not target.is_dir():
            raise _refuse(target, "is an existing file, not a folder", label)
        found = marker_kind(target)
        if found == kind or not any(target.iterdir()) or (found is None and is_own is not None and is_own(target)):
            _check_only_own_files(target, label)
            return target
        what = f"holds oodeval's {found} output, not a {label}" if found else "is an existing folder that oodeval did not create"
        raise _refuse(target, what, label)
    if target.is_dir():
        raise _refuse(target, "is an existing folder; give the path of a file to write", label)
    if kind is not None and not (is_own is not None and is_own(target)):
        raise _refuse(target, f"is an existing file that is not an oodeval {label}", label)
    return target


def _check_only_own_files(folder: Path, label: str) -> None:
    try:
        written = json.loads((folder / MARKER).read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        return
    if written is None:
        return
    foreign = sorted(set(_relative_files(folder)) - set(written) - {MARKER})
    if foreign:
        raise _refuse(folder, f"holds {len(foreign)} file(s) oodeval did not write there (e.g. {foreign[0]})", label)


def _relative_files(folder: Path) -> list[str]:
    return [p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir()]


def write_marker(folder: str | os.PathLike, kind: str, files: list[str] | None = None) -> None:
    """Mark ``folder`` as oodeval's output of ``kind`` (``files``: what a replacement may delete)."""
    from . import __version__

    body = {"kind": kind, "oodeval": __version__}
    if files is not None:
        body["files"] = sorted(files)
    (Path(folder) / MARKER).write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")


def claim_folder(folder: str | os.PathLike, kind: str, is_own: Recogniser | None = None) -> Path:
    """Create (or reuse) ``folder`` as an output of ``kind`` that commands write files into.

    Refused unless it is absent or already oodeval's ``kind`` output (see :func:`check_output`);
    files written into it later replace only oodeval's own files of the same names.
    """
    folder = check_output(folder, kind, folder=True, is_own=is_own)
    folder.mkdir(parents=True, exist_ok=True)
    if marker_kind(folder) != kind:
        write_marker(folder, kind)
    return folder


@contextmanager
def atomic_path(target: str | os.PathLike, kind: str | None = None, is_own: Recogniser | None = None) -> Iterator[Path]:
    """Yield a temporary path beside the file ``target``; on success it replaces ``target`` in one rename.

    ``kind``/``is_own``: the output rules of :func:`check_output` (checked before the body runs and
    again before the rename); ``kind=None`` for a file inside a folder oodeval owns.
    """
    target = check_output(target, kind, is_own=is_own)
    with _staged(target) as work:
        yield work
        check_output(target, kind, is_own=is_own)
        os.replace(work, target)


@contextmanager
def atomic_folder(target: str | os.PathLike, kind: str, is_own: Recogniser | None = None) -> Iterator[Path]:
    """Yield a not-yet-existing temporary folder path; on success it becomes ``target`` with its marker.

    The body creates the folder (``mkdir`` or a nested save). An existing ``target`` is replaced
    only when it is oodeval's own ``kind`` output holding nothing but what oodeval wrote there.
    """
    target = check_output(target, kind, folder=True, is_own=is_own)
    with _staged(target) as work:
        yield work
        if not work.is_dir():
            raise RuntimeError(f"the writer of {target} did not create its folder")
        write_marker(work, kind, _relative_files(work))
        check_output(target, kind, folder=True, is_own=is_own)
        if target.exists():
            os.replace(target, work.parent / "old")  # removed with the staging folder
        os.replace(work, target)


@contextmanager
def _staged(target: Path) -> Iterator[Path]:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield tmp / "payload"
        _fsync_dir(target.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def csv_header_starts(*columns: str) -> Recogniser:
    """Recognise a CSV file whose header row starts with ``columns``."""
    head = ",".join(columns)

    def is_own(path: Path) -> bool:
        with open(path, "rb") as fh:
            first = fh.readline(4096).decode("utf-8", "replace").rstrip("\r\n")
        return first == head or first.startswith(head + ",")

    return is_own


def json_has_keys(*keys: str) -> Recogniser:
    """Recognise a JSON file holding an object with all of ``keys``."""

    def is_own(path: Path) -> bool:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            return False
        return isinstance(data, dict) and all(k in data for k in keys)

    return is_own


def parquet_has_columns(*columns: str) -> Recogniser:
    """Recognise a Parquet file whose schema has all of ``columns`` (only the footer is read)."""

    def is_own(path: Path) -> bool:
        import pyarrow.parquet as pq

        try:
            names = set(pq.read_schema(path).names)
        except Exception:  # noqa: BLE001 - anything unreadable as Parquet is not ours
            return False
        return set(columns) <= names

    return is_own


def write_text_atomic(target: str | os.PathLike, text: str, kind: str | None = None, is_own: Recogniser | None = None) -> None:
    """Write ``text`` to ``target`` atomically (output rules of :func:`check_output`)."""
    with atomic_path(target, kind, is_own) as tmp:
        tmp.write_text(text)


def write_json_atomic(target: str | os.PathLike, obj: object, kind: str | None = None, is_own: Recogniser | None = None) -> None:
    """Write ``obj`` as indented, key-sorted JSON to ``target`` atomically."""
    write_text_atomic(target, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n", kind, is_own)


def save_npy_atomic(target: str | os.PathLike, arr: np.ndarray) -> None:
    """``np.save`` ``arr`` to ``target`` (a file inside an oodeval folder) atomically, no ``.npy`` appended."""
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
