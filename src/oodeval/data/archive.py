"""Read-only access to the members of a download: a folder, a .tar(.gz) / .zip archive or one file.

Used by :mod:`oodeval.data.convert`. Nothing is ever extracted to a member's own path: members
are read by name into memory, and every name is checked when the source is opened. A member
whose name is absolute or holds a ``..`` component, an archive member that is a symbolic or hard
link or a device, and a folder entry that is a symbolic link leading outside the folder are
refused (:class:`ValueError` naming the member), as is a member larger than the caller's bound.
A truncated or corrupt archive is a ValueError naming the archive (or the member being read).
"""

from __future__ import annotations

import stat
import tarfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from ..errors import InputError

__all__ = ["Source", "safe_component", "MiB"]

MiB = 1 << 20
#: tar members up to this size are read in archive order (bigger ones, the CIFAR pickles, on demand)
_AHEAD = 4 * MiB
#: what a damaged archive raises while it is listed or read
_BROKEN = (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, OSError, ValueError)


def safe_component(name: object, what: str, where: str) -> str:
    """``name`` when it is usable as one file or folder name inside an output folder, else
    ValueError naming ``where`` and ``what`` (empty, ``.``/``..``, a separator, NUL or not text)."""
    if not isinstance(name, str) or not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise InputError(f"{where}: {what} {name!r} is not a plain file name (empty, '.', '..', a path "
                         "separator or NUL); refusing it, nothing was written")
    return name


def _check_name(name: str, where: str) -> None:
    p = PurePosixPath(name)
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":") or "\\" in name or "\0" in name or ".." in p.parts:
        raise InputError(f"{where}: member {name!r} has an unsafe path (absolute, '..' or a backslash); "
                         "refusing the archive, nothing was written")


class Source:
    """The files of a folder, a .tar(.gz) or a .zip (or one ``.mat`` file), by path relative to the top."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            if path.is_dir():
                self._open_folder()
            elif zipfile.is_zipfile(path):
                self._open_zip()
            elif path.is_file() and tarfile.is_tarfile(path):
                self._open_tar()
            elif path.is_file() and path.suffix.lower() == ".mat":
                self.sizes = {path.name: path.stat().st_size}
                self._read = lambda n: path.read_bytes()
            else:
                raise InputError(f"{path} is neither a folder, a .mat file nor a readable .zip / .tar(.gz) archive "
                                 "(truncated download?)")
        except _BROKEN as exc:
            if isinstance(exc, ValueError) and str(exc).startswith(str(path)):
                raise
            raise InputError(f"{path}: truncated or corrupt archive ({type(exc).__name__}: {exc}); download it again") from None
        self.names = sorted(self.sizes)

    def _open_folder(self) -> None:
        top = self.path.resolve()
        self.sizes = {}
        for p in self.path.rglob("*"):
            rel = p.relative_to(self.path).as_posix()
            if p.is_symlink() and not p.resolve().is_relative_to(top):
                raise InputError(f"{p}: a symbolic link leading outside {self.path}; refusing it, nothing was written")
            if p.is_file():
                self.sizes[rel] = p.stat().st_size
        self._read = lambda n: (self.path / n).read_bytes()

    def _open_zip(self) -> None:
        zf = zipfile.ZipFile(self.path)
        self.sizes = {}
        for info in zf.infolist():
            _check_name(info.filename, f"{self.path}")
            kind = stat.S_IFMT(info.external_attr >> 16)
            if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
                raise InputError(f"{self.path}: member {info.filename!r} is a link or special file; refusing the "
                                 "archive, nothing was written")
            if not info.is_dir():
                self.sizes[info.filename] = info.file_size
        self._read = zf.read

    def _open_tar(self) -> None:
        tf = tarfile.open(self.path)
        members = {}
        for m in tf.getmembers():
            _check_name(m.name, f"{self.path}")
            if not (m.isfile() or m.isdir()):
                raise InputError(f"{self.path}: member {m.name!r} is a link or special file; refusing the archive, "
                                 "nothing was written")
            if m.isfile():
                members[m.name] = m
        self.sizes = {n: m.size for n, m in members.items()}
        order = (m for m in tf.getmembers() if m.isfile() and m.size <= _AHEAD)
        ahead: dict[str, bytes] = {}

        def read(name: str) -> bytes:
            # a compressed tar seeks backwards by decompressing from its start: small members are
            # read in archive order and the ones passed on the way kept until asked for
            if name in ahead:
                return ahead.pop(name)
            if members[name].size <= _AHEAD:
                for m in order:
                    data = tf.extractfile(m).read()
                    if m.name == name:
                        return data
                    ahead[m.name] = data
            return tf.extractfile(members[name]).read()

        self._read = read

    def where(self, name: str) -> str:
        """How messages name a member: ``FOLDER/NAME``, ``ARCHIVE:NAME`` or the file itself."""
        if self.path.is_dir():
            return str(self.path / name)
        return str(self.path) if self.names == [name] and self.path.name == name else f"{self.path}:{name}"

    def read(self, name: str, limit: int) -> bytes:
        """The bytes of member ``name``; ValueError naming it when larger than ``limit`` bytes or unreadable."""
        if self.sizes[name] > limit:
            raise InputError(f"{self.where(name)}: {self.sizes[name]:,} bytes, more than the {limit // MiB} MiB "
                             "such a file can hold in this format; refusing it")
        try:
            data = self._read(name)
        except _BROKEN as exc:
            raise InputError(f"{self.where(name)}: truncated or corrupt ({type(exc).__name__}: {exc}); "
                             "download it again") from None
        if len(data) > limit:
            raise InputError(f"{self.where(name)}: more than {limit // MiB} MiB; refusing it")
        return data

    def find(self, basename: str, required: bool = True) -> str | None:
        """The one member called ``basename`` (at any depth); None when absent and not ``required``."""
        hits = [n for n in self.names if n.rsplit("/", 1)[-1] == basename]
        if len(hits) > 1 or (required and not hits):
            raise FileNotFoundError(f"{self.path}: expected one file named {basename}, found {len(hits)}"
                                    + (f" ({', '.join(hits[:3])})" if hits else ""))
        return hits[0] if hits else None
