"""Safe atomic outputs and content hashing shared by every writer in oodeval.

An output is oodeval's when it carries oodeval's marker, nothing else (never a file name, a CSV
header or a schema that users also write):

- A *folder* output holds the marker ``.oodeval-output.jsonl``: a first line naming its kind and
  the oodeval version, then one line per file oodeval wrote there, with its blake2b digest
  (appended atomically, so concurrent writers lose no line). An existing folder is written into
  only when its marker names the same kind, and an existing file in it is replaced only when the
  marker lists that name with the file's present digest (any content oodeval wrote there);
  a folder replaced whole must hold nothing but such files. A marker-less folder is the user's,
  except an empty one, and an older oodeval folder carrying the old marker ``.oodeval-output.json``
  of the same kind whose file list covers everything in it (the outputs of :func:`atomic_folder`).
- A *file* output carries its marker inside: a first line ``# oodeval-output: {...}`` (CSV), the
  key ``"oodeval-output"`` (JSON), or the metadata key ``oodeval-output`` (Parquet, safetensors).
  An existing file is replaced only when its marker names the same kind.

Anything else is refused with :class:`OutputPathError` before any work is done, and checked again
just before the rename. Staging folders left by a killed writer are removed by the next write into
the same folder. Written files and folders get the user's normal mode (the umask).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import struct
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from . import __version__
from .errors import InputError

MARKER = ".oodeval-output.jsonl"
#: the marker of oodeval before 0.1 listed file digests: a JSON object with kind and file names
LEGACY_MARKER = ".oodeval-output.json"
#: the key of the marker inside a single-file output (JSON key, Parquet and safetensors metadata)
FILE_MARKER_KEY = "oodeval-output"
#: the first line of a CSV output, followed by the marker's JSON
CSV_MARKER_PREFIX = "# oodeval-output: "
_STAGING_STAMP = ".oodeval-staging"


class OutputPathError(FileExistsError, InputError):
    """An output path oodeval refuses to write because it would replace what oodeval did not create."""


def stamp(kind: str) -> dict[str, str]:
    """The marker of a single-file output of ``kind``: ``{"kind", "oodeval": version}``."""
    return {"kind": kind, "oodeval": __version__}


def stamp_text(kind: str) -> str:
    """:func:`stamp` as compact JSON (the Parquet / safetensors metadata value)."""
    return json.dumps(stamp(kind), sort_keys=True, separators=(",", ":"))


def csv_marker_line(kind: str) -> str:
    """The first line of a CSV output of ``kind`` (with its newline)."""
    return CSV_MARKER_PREFIX + stamp_text(kind) + "\n"


def strip_csv_marker(text: str) -> str:
    """``text`` without its first line when that line is oodeval's CSV marker."""
    if text.startswith(CSV_MARKER_PREFIX):
        return text.split("\n", 1)[1] if "\n" in text else ""
    return text


def file_marker_kind(path: str | os.PathLike) -> str | None:
    """The kind in the marker a single-file output carries inside (CSV first line, JSON key,
    Parquet or safetensors metadata), or None when it has none or cannot be read."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
            if head.startswith(b"PAR1"):
                import pyarrow.parquet as pq

                meta = pq.read_schema(path).metadata or {}
                found = meta.get(FILE_MARKER_KEY.encode())
            elif head.startswith(CSV_MARKER_PREFIX.encode()):
                found = head.split(b"\n", 1)[0][len(CSV_MARKER_PREFIX) :]
            elif head.lstrip()[:1] == b"{":
                data = json.loads(head + fh.read())
                found = data.get(FILE_MARKER_KEY) if isinstance(data, dict) else None
            elif len(head) >= 8 and 2 <= struct.unpack("<Q", head[:8])[0] <= 100_000_000:
                fh.seek(8)
                meta = json.loads(fh.read(struct.unpack("<Q", head[:8])[0])).get("__metadata__") or {}
                found = meta.get(FILE_MARKER_KEY)
            else:
                return None
        if isinstance(found, (bytes, str)):
            found = json.loads(found)
        return str(found["kind"]) if isinstance(found, dict) and "kind" in found else None
    except Exception:  # noqa: BLE001 - anything unreadable carries no marker
        return None


def file_digest(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """blake2b (16 bytes) of a file's bytes, read in chunks."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def _read_marker(folder: Path) -> tuple[str | None, dict[str, set[str]]]:
    """(kind, {file: every digest recorded for it}) of ``folder``'s marker; (None, {}) without one.
    A torn last line (a writer killed mid-append) is ignored: its file stays unlisted."""
    try:
        lines = (folder / MARKER).read_text().splitlines()
        head = json.loads(lines[0])
        kind = str(head["kind"])
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None, {}
    files: dict[str, set[str]] = {}
    for line in lines[1:]:
        try:
            rec = json.loads(line)
            files.setdefault(str(rec["file"]), set()).add(str(rec["blake2b"]))
        except (ValueError, KeyError, TypeError):
            continue
    return kind, files


def marker_kind(folder: str | os.PathLike) -> str | None:
    """The kind recorded in ``folder``'s oodeval marker, or None when it has none (or an unreadable one).
    Reads the first line only (a marker grows by one line per file written)."""
    try:
        with open(Path(folder) / MARKER, encoding="utf-8") as fh:
            return str(json.loads(fh.readline())["kind"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _legacy_files(folder: Path, kind: str) -> list[str] | None:
    """The file list of an older oodeval marker of ``kind`` when it covers everything in ``folder``."""
    try:
        old = json.loads((folder / LEGACY_MARKER).read_text())
        listed = set(old["files"]) if old.get("kind") == kind else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    present = set(_relative_files(folder)) - {LEGACY_MARKER}
    return sorted(present) if listed is not None and present <= listed else None


def _refuse(target: Path, what: str, kind: str) -> OutputPathError:
    return OutputPathError(
        f"{target} {what}; oodeval replaces only its own {kind} output and never deletes anything else. "
        f"Choose another output path, or move or remove {target} yourself"
    )


def check_output(
    target: str | os.PathLike, kind: str | None, *, folder: bool = False, whole: bool = False
) -> Path:
    """Raise :class:`OutputPathError` unless writing ``target`` replaces only oodeval's own output of ``kind``.

    ``folder``: a folder output (``whole``: replaced whole, so everything in it must be listed in its
    marker). ``kind=None`` is an internal file inside a folder oodeval owns: an existing file is
    replaced only when that folder's marker lists it with its present digest. Ownership is the
    marker's alone. Returns ``target``; nothing is touched.
    """
    target = Path(target)
    label = kind or "file"
    if target.is_symlink():
        raise _refuse(target, "is a symbolic link", label)
    if kind is None and not folder:
        owner = _owner(target)
        if owner is not None and marker_kind(owner) is None and not _holds_only_staging(owner):
            raise _refuse(owner, "is an existing folder without oodeval's marker inside oodeval's output (oodeval did not create it)", "file")
    if not target.exists():
        return target
    if folder:
        if not target.is_dir():
            raise _refuse(target, "is an existing file, not a folder", label)
        found, files = _read_marker(target)
        if found is None:
            if _holds_only_staging(target) or _legacy_files(target, str(kind)) is not None:
                return target
            raise _refuse(target, f"is an existing folder without oodeval's marker {MARKER} (oodeval did not create it)", label)
        if found != kind:
            raise _refuse(target, f"holds oodeval's {found} output, not a {label}", label)
        if whole:
            _check_only_own_files(target, files, label)
        return target
    if target.is_dir():
        raise _refuse(target, "is an existing folder; give the path of a file to write", label)
    if kind is None:
        owner = _owner(target)
        if owner is not None and owner.is_dir() and not _listed(owner, target):
            raise _refuse(target, f"is a file oodeval did not write there (its folder's marker {owner / MARKER} "
                                  "does not list it with this content)", "file")
        return target
    if file_marker_kind(target) != kind:
        raise _refuse(target, f"is an existing file without oodeval's {label} marker (oodeval did not write it, an oodeval "
                              "older than the marker did, or it is damaged so that its marker cannot be read)", label)
    return target


def _is_staging(entry: Path) -> bool:
    return entry.name.startswith(".") and entry.name.endswith(".tmp") and (entry / _STAGING_STAMP).is_file()


def _holds_only_staging(folder: Path) -> bool:
    """Whether ``folder`` is absent or empty but for oodeval's staging folders (an empty folder)."""
    return not folder.is_dir() or all(_is_staging(p) for p in folder.iterdir())


def _listed(owner: Path, target: Path) -> bool:
    files = _read_marker(owner)[1]
    rel = target.relative_to(owner).as_posix()
    return rel in files and file_digest(target) in files[rel]


def _check_only_own_files(folder: Path, files: dict[str, set[str]], label: str) -> None:
    foreign, changed = [], []
    for rel in sorted(set(_relative_files(folder)) - {MARKER, LEGACY_MARKER}):
        if rel not in files:
            foreign.append(rel)
        elif file_digest(folder / rel) not in files[rel]:
            changed.append(rel)
    if foreign:
        raise _refuse(folder, f"holds {len(foreign)} file(s) oodeval did not write there (e.g. {foreign[0]})", label)
    if changed:
        raise _refuse(folder, f"holds {len(changed)} file(s) changed since oodeval wrote them (e.g. {changed[0]})", label)


def _relative_files(folder: Path) -> list[str]:
    """Every file under ``folder`` (relative, POSIX), oodeval's staging folders left out."""
    out = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if not _is_staging(Path(root) / d)]
        out += [(Path(root) / n).relative_to(folder).as_posix() for n in names]
    return out


def _owner(target: Path) -> Path | None:
    """The marked folder an internal file belongs to: its parent when marked, or a parent (to be
    created or claimed) whose own parent is marked; None outside any oodeval folder."""
    parent = target.parent
    if marker_kind(parent) is not None:
        return parent
    if marker_kind(parent.parent) is not None:
        return parent
    return None


def remove_own(path: str | os.PathLike) -> bool:
    """Delete the file ``path`` when its folder's marker lists it with its present content (oodeval
    wrote it); refuse with :class:`OutputPathError` when it is there but not oodeval's. False when absent."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return False
    check_output(path, None)
    if _owner(path) is None:
        raise _refuse(path, "is not inside a folder carrying oodeval's marker", "file")
    path.unlink()
    return True


def write_marker(folder: str | os.PathLike, kind: str, files: dict[str, str] | None = None) -> None:
    """Mark ``folder`` as oodeval's output of ``kind``, listing ``files`` ({name: digest}).

    The marker appears whole or not at all, and an existing one is never overwritten."""
    folder = Path(folder)
    lines = [json.dumps({"kind": kind, "oodeval": __version__}, sort_keys=True)]
    lines += [json.dumps({"file": f, "blake2b": d}, sort_keys=True) for f, d in sorted((files or {}).items())]
    fd, tmp = tempfile.mkstemp(prefix=".oodeval-marker.", dir=folder)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write("\n".join(lines) + "\n")
        _umask_mode(Path(tmp))
        try:
            os.link(tmp, folder / MARKER)
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)


def record_files(folder: Path, files: dict[str, str]) -> None:
    """Append ``files`` ({name relative to ``folder``: digest}) to ``folder``'s marker, one
    ``O_APPEND`` write (whole lines even with concurrent writers)."""
    if not files:
        return
    text = "".join(json.dumps({"file": f, "blake2b": d}, sort_keys=True) + "\n" for f, d in sorted(files.items()))
    fd = os.open(folder / MARKER, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def claim_folder(folder: str | os.PathLike, kind: str) -> Path:
    """Create (or reuse) ``folder`` as an output of ``kind`` that commands write files into.

    Refused unless it is absent, empty, or already oodeval's ``kind`` output (see :func:`check_output`).
    Files written into it later replace only files its marker lists.
    """
    folder = check_output(folder, kind, folder=True)
    folder.mkdir(parents=True, exist_ok=True)
    if marker_kind(folder) != kind:
        legacy = _legacy_files(folder, kind) or []
        write_marker(folder, kind, {rel: file_digest(folder / rel) for rel in legacy})
    return folder


@contextmanager
def atomic_path(
    target: str | os.PathLike, kind: str | None = None, *, private: bool = False
) -> Iterator[Path]:
    """Yield a temporary path beside the file ``target``; on success it replaces ``target`` in one rename.

    ``kind``: the output rules of :func:`check_output` (checked before the body runs and again before
    the rename). ``kind=None`` for a file (or a folder the body creates) inside
    a folder oodeval owns: it is listed in that folder's marker, with its digest, before the rename.
    The result gets the umask's mode, whatever mode its writer gave it, unless ``private`` (a file
    holding secrets, which keeps the mode the body set).
    """
    target = check_output(target, kind)
    with _staged(target) as work:
        yield work
        check_output(target, kind)
        owner = _owner(target) if kind is None else None
        if owner is not None:
            _record_payload(owner, target, work)
        if not private:
            _umask_mode(work)
        os.replace(work, target)


def _record_payload(owner: Path, target: Path, work: Path) -> None:
    if marker_kind(owner) is None:  # a new sub-folder of a marked folder: the same kind of output
        write_marker(owner, str(marker_kind(owner.parent)))
    rel = target.relative_to(owner).as_posix()
    if work.is_dir():
        files = {f"{rel}/{p.relative_to(work).as_posix()}": file_digest(p) for p in sorted(work.rglob("*")) if p.is_file()}
    else:
        files = {rel: file_digest(work)}
    record_files(owner, files)


@contextmanager
def atomic_folder(target: str | os.PathLike, kind: str) -> Iterator[Path]:
    """Yield a not-yet-existing temporary folder path; on success it becomes ``target`` with its marker.

    The body creates the folder (``mkdir`` or a nested save). An existing ``target`` is replaced
    only when it is oodeval's own ``kind`` output holding nothing but what its marker lists.
    """
    target = check_output(target, kind, folder=True, whole=True)
    with _staged(target) as work:
        yield work
        if not work.is_dir():
            raise RuntimeError(f"the writer of {target} did not create its folder")
        (work / MARKER).unlink(missing_ok=True)  # a nested save's marker: the outer one lists everything
        write_marker(work, kind, {rel: file_digest(work / rel) for rel in _relative_files(work)})
        check_output(target, kind, folder=True, whole=True)
        _umask_mode(work)
        if target.exists():
            os.replace(target, work.parent / "old")  # removed with the staging folder
        os.replace(work, target)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_staging(folder: Path) -> list[Path]:
    """Remove staging folders in ``folder`` left by a killed oodeval writer: those carrying the
    staging stamp of a process on this host that no longer runs. Returns what was removed."""
    removed = []
    try:
        entries = [e for e in os.scandir(folder) if e.name.startswith(".") and e.name.endswith(".tmp") and e.is_dir(follow_symlinks=False)]
    except OSError:
        return removed
    host = socket.gethostname()
    for e in entries:
        try:
            who, pid = (Path(e.path) / _STAGING_STAMP).read_text().rsplit(" ", 1)
        except (OSError, ValueError):
            continue
        if who == host and pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(e.path, ignore_errors=True)
            removed.append(Path(e.path))
    return removed


@contextmanager
def _staged(target: Path) -> Iterator[Path]:
    target.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_staging(target.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        (tmp / _STAGING_STAMP).write_text(f"{socket.gethostname()} {os.getpid()}")
        yield tmp / "payload"
        _fsync_dir(target.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _umask() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _umask_mode(path: Path) -> None:
    """Give ``path`` (and, for a folder, everything under it) the umask's mode: some writers
    (safetensors) create their files 0600."""
    mask = _umask()
    for p in [path, *(path.rglob("*") if path.is_dir() else ())]:
        os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~mask)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(target: str | os.PathLike, text: str, kind: str | None = None) -> None:
    """Write ``text`` to ``target`` atomically (output rules of :func:`check_output`); with a
    ``kind`` the text must already carry that kind's marker (see :func:`write_csv_atomic`)."""
    with atomic_path(target, kind) as tmp:
        tmp.write_text(text)


def write_csv_atomic(target: str | os.PathLike, text: str, kind: str) -> None:
    """Write the CSV ``text`` to ``target`` atomically, its first line oodeval's marker of ``kind``."""
    write_text_atomic(target, csv_marker_line(kind) + text, kind)


def write_json_atomic(target: str | os.PathLike, obj: object, kind: str | None = None) -> None:
    """Write ``obj`` as indented, key-sorted JSON to ``target`` atomically; with a ``kind`` (a
    stand-alone output, ``obj`` a dict) it carries the marker under the key ``"oodeval-output"``."""
    if kind is not None:
        obj = {**dict(obj), FILE_MARKER_KEY: stamp(kind)}  # type: ignore[call-overload]
    write_text_atomic(target, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n", kind)


def write_parquet_atomic(target: str | os.PathLike, df, kind: str) -> None:
    """Write the DataFrame ``df`` to ``target`` as Parquet atomically, the marker of ``kind`` in its metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(df, preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), FILE_MARKER_KEY.encode(): stamp_text(kind).encode()})
    with atomic_path(target, kind) as tmp:
        pq.write_table(table, tmp)


def save_npy_atomic(target: str | os.PathLike, arr: np.ndarray) -> None:
    """``np.save`` ``arr`` to ``target`` (a file inside an oodeval folder) atomically, no ``.npy`` appended."""
    with atomic_path(target) as tmp, open(tmp, "wb") as fh:
        np.save(fh, np.ascontiguousarray(arr))


def hash_arrays(arrays: dict[str, np.ndarray], chunk_rows: int = 65536, chunk_bytes: int = 1 << 26) -> str:
    """blake2b over names, dtypes, shapes and bytes of the arrays (chunked, works on memmaps): at most
    ``chunk_rows`` rows and ``chunk_bytes`` bytes are copied at a time (wide rows, e.g. (N, P, E) patch
    tokens, are not copied 65536 at once); the chunking does not change the hash."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(arrays):
        a = arrays[name]
        h.update(f"{name}|{a.dtype.str}|{a.shape}".encode())
        if a.ndim == 0:
            h.update(np.ascontiguousarray(a).tobytes())
            continue
        row = max(1, a.itemsize * int(np.prod(a.shape[1:], dtype=np.int64)))
        step = max(1, min(chunk_rows, chunk_bytes // row))
        for start in range(0, a.shape[0], step):
            h.update(np.ascontiguousarray(a[start : start + step]).tobytes())
    return h.hexdigest()


def hash_json(obj: object) -> str:
    """Stable short hash of a JSON-serialisable object."""
    return hashlib.blake2b(json.dumps(obj, sort_keys=True, default=str).encode(), digest_size=16).hexdigest()
