"""Manifest: the list of images of one dataset, their labels and optional OOD annotations.

A manifest row is ``path, label[, ood_label, fine_grained, split, class_name]``. ``label`` is the
integer ID class (-1 = unknown, e.g. every OOD image); ``ood_label`` names the OOD concept;
``fine_grained`` flags a close sibling of an ID class (Fi-ImageNet-1k, Sec. 3); ``split`` is a free
tag (train/test, ...). Paths are absolute or relative to ``root``. A path ``FILE#K`` names image K
inside a container file (the IDX files of Fashion-MNIST), see :mod:`oodeval.data.images`.
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._io import hash_json, strip_csv_marker, write_csv_atomic
from ..errors import InputError

__all__ = ["Manifest", "IMAGE_EXTENSIONS", "list_images", "parse_labels"]

#: file suffixes treated as images when scanning folders (case-insensitive).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")

_TRUE = {"1", "true", "yes", "y", "t"}
_INT64 = (-(2**63), 2**63 - 1)
_FALSE = {"0", "false", "no", "n", "f", ""}


def list_images(folder: Path) -> list[Path]:
    """Every image file under ``folder`` (recursive, hidden entries skipped), sorted by path."""
    out = []
    for p in folder.rglob("*"):
        if any(part.startswith(".") for part in p.relative_to(folder).parts):
            continue
        if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file():
            out.append(p)
    return sorted(out)


@dataclass
class Manifest:
    """Images of one dataset with integer labels (-1 = unknown) and optional OOD annotations."""

    paths: list[str]
    labels: np.ndarray
    ood_label: list[str] | None = None
    fine_grained: np.ndarray | None = None
    split: list[str] | None = None
    class_names: list[str] | None = None
    root: Path | None = None
    name: str = "dataset"
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.paths = [str(p) for p in self.paths]
        self.labels = np.asarray(self.labels, dtype=np.int64).reshape(-1)
        if self.root is not None:
            self.root = Path(os.path.abspath(self.root))  # absolute, so hashes do not depend on the cwd
        if self.fine_grained is not None:
            self.fine_grained = np.asarray(self.fine_grained, dtype=bool).reshape(-1)
        n = len(self.paths)
        problems = []
        if self.labels.shape != (n,):
            problems.append(f"{self.labels.size} labels for {n} paths")
        for col in ("ood_label", "split"):
            v = getattr(self, col)
            if v is not None:
                setattr(self, col, [str(x) for x in v])
                if len(v) != n:
                    problems.append(f"{len(v)} {col} values for {n} paths")
        if self.fine_grained is not None and self.fine_grained.shape != (n,):
            problems.append(f"{self.fine_grained.size} fine_grained values for {n} paths")
        if (self.labels < -1).any():
            problems.append(f"{int((self.labels < -1).sum())} labels below -1")
        if self.class_names is not None and n and self.labels.max(initial=-1) >= len(self.class_names):
            problems.append(f"label {int(self.labels.max())} but only {len(self.class_names)} class names")
        if problems:
            raise InputError(f"inconsistent manifest {self.name!r}: " + "; ".join(problems))

    def __len__(self) -> int:
        return len(self.paths)

    def resolve_path(self, i: int) -> str:
        """Path of row ``i`` made absolute against ``root`` (container suffix ``#K`` kept)."""
        p = self.paths[i]
        if self.root is None or Path(p.split("#", 1)[0]).is_absolute():
            return p
        return str(self.root / p)

    def missing_files(self) -> list[str]:
        """Resolved paths of the rows whose file (or, for ``FILE#K``, container file) does not exist."""
        containers: dict[str, bool] = {}
        out = []
        for i in range(len(self)):
            p = self.resolve_path(i)
            if "#" in p and not os.path.exists(p):
                c = p.rsplit("#", 1)[0]
                ok = containers.setdefault(c, os.path.isfile(c))
            else:
                ok = os.path.isfile(p)
            if not ok:
                out.append(p)
        return out

    @property
    def num_classes(self) -> int:
        """Number of ID classes: len(class_names), else max label + 1."""
        if self.class_names is not None:
            return len(self.class_names)
        return int(self.labels.max(initial=-1)) + 1

    # ------------------------------------------------------------------ building
    @classmethod
    def from_image_folder(cls, folder: str | Path, *, name: str | None = None, labelled: bool = True) -> Manifest:
        """ImageFolder tree ``folder/<class>/<image>``; classes in sorted order get labels 0..C-1.

        With ``labelled=False`` every image (at any depth) gets label -1 and its first
        sub-folder, if any, becomes its ``ood_label`` (the layout of NINCO and similar OOD sets).
        """
        folder = Path(folder)
        if not folder.is_dir():
            raise FileNotFoundError(f"image folder {folder} does not exist")
        files = list_images(folder)
        if not files:
            raise InputError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) found under {folder}")
        rel = [f.relative_to(folder) for f in files]
        name = name or folder.name
        if labelled:
            loose = [str(r) for r in rel if len(r.parts) < 2]
            if loose:
                raise InputError(
                    f"{folder} is not an ImageFolder tree (<class>/<image>): {len(loose)} images lie "
                    f"directly in it, e.g. {loose[0]}; use labelled=False for an unlabelled folder"
                )
            classes = sorted({r.parts[0] for r in rel})
            index = {c: i for i, c in enumerate(classes)}
            labels = [index[r.parts[0]] for r in rel]
            return cls([r.as_posix() for r in rel], np.array(labels), class_names=classes, root=folder, name=name)
        ood = [r.parts[0] if len(r.parts) > 1 else "" for r in rel]
        return cls(
            [r.as_posix() for r in rel],
            np.full(len(rel), -1),
            ood_label=ood if any(ood) else None,
            root=folder,
            name=name,
        )

    @classmethod
    def from_csv(cls, path: str | Path, *, root: str | Path | None = None, name: str | None = None,
                 class_names: Sequence[str] | None = None) -> Manifest:
        """Read a CSV with header ``path,label[,ood_label,fine_grained,split,class_name]``.

        Relative paths are taken relative to ``root`` (default: the CSV's folder). Labels are parsed
        (:func:`parse_labels`): integers stay their integer (-1 or empty = unknown); a column of names
        only is mapped to 0..C-1 in sorted order; float-looking or mixed labels are refused unless
        ``class_names`` (the class list, its index = the label) is given. ``class_name`` (optional)
        names each row's integer label. UTF-8 with or without a BOM (Excel); a row with more or
        fewer cells than the header is refused.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"manifest {path} does not exist")
        try:
            text = strip_csv_marker(path.read_text(encoding="utf-8-sig"))
        except UnicodeDecodeError as exc:
            raise InputError(f"manifest {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8 CSV") from exc
        reader = csv.DictReader(io.StringIO(text, newline=""))
        cols = reader.fieldnames or []
        rows = list(reader)
        missing = [c for c in ("path", "label") if c not in cols]
        if missing:
            raise InputError(f"manifest {path} lacks column(s) {', '.join(missing)}; header is {cols}")
        if not rows:
            raise InputError(f"manifest {path} has no rows")
        ragged = [i + 2 for i, r in enumerate(rows) if None in r or any(v is None for v in r.values())]
        if ragged:
            raise InputError(f"manifest {path}: {len(ragged)} row(s) have more or fewer cells than the {len(cols)} header columns "
                             f"(lines {_lines(ragged)}); quote cells that hold commas")
        labels, parsed_names = parse_labels([r["label"] for r in rows], class_names, where=f"manifest {path}")
        class_names = parsed_names
        if "class_name" in cols and class_names is None:
            names: dict[int, str] = {}
            for lab, r in zip(labels, rows):
                if lab >= 0 and r["class_name"]:
                    if names.setdefault(int(lab), r["class_name"]) != r["class_name"]:
                        raise InputError(f"manifest {path}: label {lab} has two class names "
                                         f"{names[int(lab)]!r} and {r['class_name']!r}")
            if names:
                c = max(names) + 1
                class_names = [names.get(i, str(i)) for i in range(c)]
        fine = None
        if "fine_grained" in cols:
            bad = [r["fine_grained"] for r in rows if r["fine_grained"].strip().lower() not in _TRUE | _FALSE]
            if bad:
                raise InputError(f"manifest {path}: {len(bad)} fine_grained values are not booleans, e.g. {bad[0]!r}")
            fine = np.array([r["fine_grained"].strip().lower() in _TRUE for r in rows])
        return cls(
            [r["path"] for r in rows],
            labels,
            ood_label=[r["ood_label"] for r in rows] if "ood_label" in cols else None,
            fine_grained=fine,
            split=[r["split"] for r in rows] if "split" in cols else None,
            class_names=class_names,
            root=Path(root) if root is not None else path.parent,
            name=name or (path.parent.name if path.name == "manifest.csv" else path.stem),
        )

    # ------------------------------------------------------------------ writing
    def to_csv_text(self, relative_to: Path | None = None) -> str:
        """The CSV text ``to_csv`` writes; paths relative to ``relative_to`` where possible."""
        cols = ["path", "label"]
        for c in ("ood_label", "fine_grained", "split"):
            if getattr(self, c) is not None:
                cols.append(c)
        if self.class_names is not None:
            cols.append("class_name")
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(cols)
        for i in range(len(self)):
            p = self.paths[i]
            if relative_to is not None:
                p = os.path.abspath(self.resolve_path(i))
                try:
                    p = Path(p).relative_to(relative_to).as_posix()
                except ValueError:
                    pass  # outside the CSV's folder: keep the absolute path
            row = [p, int(self.labels[i])]
            if self.ood_label is not None:
                row.append(self.ood_label[i])
            if self.fine_grained is not None:
                row.append(int(self.fine_grained[i]))
            if self.split is not None:
                row.append(self.split[i])
            if self.class_names is not None:
                row.append(self.class_names[self.labels[i]] if self.labels[i] >= 0 else "")
            w.writerow(row)
        return buf.getvalue()

    def to_csv(self, path: str | Path) -> Path:
        """Write the manifest atomically; paths are made relative to the CSV's folder when inside it.

        A manifest without ``root`` keeps its paths as they are (relative ones then refer to the
        CSV's folder when read back). The first line is oodeval's marker (``# oodeval-output: ...``);
        an existing file is replaced only when it carries the manifest marker; anything else is refused.
        """
        path = Path(path)
        text = self.to_csv_text(relative_to=Path(os.path.abspath(path.parent)) if self.root is not None else None)
        write_csv_atomic(path, text, "manifest")
        return path

    def absolute(self) -> Manifest:
        """A copy whose paths are absolute (resolved against ``root``) and whose root is None."""
        m = self.subset(np.arange(len(self)))
        m.paths = [self.resolve_path(i) for i in range(len(self))]
        m.root = None
        return m

    # ------------------------------------------------------------------ queries
    def content_hash(self) -> str:
        """Hash of the resolved paths and every annotation column (not of the image bytes)."""
        return hash_json(
            {
                "paths": [self.resolve_path(i) for i in range(len(self))],
                "labels": self.labels.tolist(),
                "ood_label": self.ood_label,
                "fine_grained": None if self.fine_grained is None else self.fine_grained.tolist(),
                "split": self.split,
                "class_names": self.class_names,
            }
        )

    def images_digest(self, full: bool = False) -> str:
        """Hash of the images' content: per file (a container ``FILE#K`` counts once) its size,
        ``mtime_ns`` and a blake2b of three 16 KiB samples (start, middle, end); ``full``: a blake2b
        of every byte instead of the samples. A missing file enters as missing."""
        h = hashlib.blake2b(digest_size=16)
        h.update(b"full" if full else b"fast")
        seen: set[str] = set()
        for i in range(len(self)):
            p = self.resolve_path(i)
            if "#" in p and not os.path.exists(p):
                p = p.rsplit("#", 1)[0]
            if p in seen:
                continue
            seen.add(p)
            h.update(os.fsencode(p) + b"\0" + _file_fingerprint(p, full).encode() + b"\n")
        return h.hexdigest()

    def subset(self, index: Sequence[int] | np.ndarray, name: str | None = None) -> Manifest:
        """Rows ``index`` (in that order) as a new manifest sharing root and class names."""
        idx = np.asarray(index, dtype=np.int64).reshape(-1)
        pick = lambda v: None if v is None else [v[i] for i in idx]  # noqa: E731
        return Manifest(
            [self.paths[i] for i in idx],
            self.labels[idx],
            ood_label=pick(self.ood_label),
            fine_grained=None if self.fine_grained is None else self.fine_grained[idx],
            split=pick(self.split),
            class_names=self.class_names,
            root=self.root,
            name=name or self.name,
            meta=dict(self.meta),
        )

    def select(self, split: str | Sequence[str] | None = None, *, fine_grained: bool | None = None) -> Manifest:
        """Rows whose ``split`` is ``split`` (or one of them) and, if given, whose fine_grained flag matches."""
        keep = np.ones(len(self), dtype=bool)
        name = self.name
        if split is not None:
            wanted = {split} if isinstance(split, str) else set(split)
            if self.split is None:
                raise InputError(f"manifest {self.name!r} has no split column; cannot select split {sorted(wanted)}")
            have = sorted(set(self.split))
            unknown = sorted(wanted - set(have))
            if unknown:
                raise InputError(f"manifest {self.name!r} has no split {unknown}; its splits are {have}")
            keep &= np.array([s in wanted for s in self.split])
            name = f"{self.name}:{'+'.join(sorted(wanted))}"
        if fine_grained is not None:
            if self.fine_grained is None:
                raise InputError(f"manifest {self.name!r} has no fine_grained column")
            keep &= self.fine_grained == fine_grained
        return self.subset(np.flatnonzero(keep), name=name)


def _file_fingerprint(path: str, full: bool, sample: int = 1 << 14) -> str:
    """``size:mtime_ns:blake2b`` of a file (three samples, or every byte with ``full``); "missing" when absent."""
    try:
        st = os.stat(path)
        h = hashlib.blake2b(digest_size=16)
        with open(path, "rb") as fh:
            if full or st.st_size <= 3 * sample:
                while block := fh.read(1 << 20):
                    h.update(block)
            else:
                for at in (0, st.st_size // 2 - sample // 2, st.st_size - sample):
                    fh.seek(at)
                    h.update(fh.read(sample))
    except OSError:
        return "missing"
    return f"{st.st_size}:{st.st_mtime_ns}:{h.hexdigest()}"


def _lines(numbers: list[int], most: int = 5) -> str:
    return ", ".join(map(str, numbers[:most])) + (f" and {len(numbers) - most} more" if len(numbers) > most else "")


def _as_int(text: str) -> int | None:
    """The integer a label cell spells (``"3"``, ``"-1"``, ``"+2"``), else None (``"2.0"``, ``"1e3"``, names)."""
    t = text.strip()
    return int(t) if t.lstrip("+-").isdigit() else None


def parse_labels(raw: Sequence[str], class_names: Sequence[str] | None = None, where: str = "manifest") -> tuple[np.ndarray, list[str] | None]:
    """(int64 labels, class names or None) of label cells, parsed, never renumbered by sorting.

    An empty cell is -1 (unknown). With ``class_names``: a cell equal to a name is its index, an
    integer cell stays its integer, anything else is refused. Without: integer cells stay their
    integer; a column of names only (no cell integer- or number-like) maps the names in sorted order
    to 0..C-1; a float-looking cell (``2.0``, ``1e30``) or names mixed with integers is refused with
    its data lines named (header = line 1). Integers beyond int64 are refused.
    """
    cells = [str(x).strip() for x in raw]
    lines = lambda idx: _lines([i + 2 for i in idx])  # noqa: E731
    ints = [_as_int(c) for c in cells]
    big = [i for i, v in enumerate(ints) if v is not None and not _INT64[0] <= v <= _INT64[1]]
    if big:
        raise InputError(f"{where}: label {cells[big[0]]!r} does not fit a 64-bit integer (line {lines(big)})")
    if class_names is not None:
        index = {str(c): i for i, c in enumerate(class_names)}
        out, bad = [], []
        for i, (c, v) in enumerate(zip(cells, ints)):
            if c in index:
                out.append(index[c])
            elif c == "" or v is not None:
                out.append(-1 if c == "" else v)
            else:
                bad.append(i)
        if bad:
            raise InputError(f"{where}: label {cells[bad[0]]!r} is neither an integer nor one of the {len(index)} class names (lines {lines(bad)})")
        return np.array(out, dtype=np.int64), [str(c) for c in class_names]
    named = [i for i, (c, v) in enumerate(zip(cells, ints)) if c != "" and v is None]
    if not named:
        return np.array([-1 if c == "" else v for c, v in zip(cells, ints)], dtype=np.int64), None
    numeric = [i for i in named if _is_number(cells[i])]
    if numeric:
        raise InputError(f"{where}: label {cells[numeric[0]]!r} is not an integer (lines {lines(numeric)}); "
                         "write integer labels, or give the class list to read labels as names")
    integers = [i for i, v in enumerate(ints) if v is not None and v != -1]
    if integers:
        raise InputError(f"{where}: labels mix class names (e.g. {cells[named[0]]!r}, line {named[0] + 2}) with integers "
                         f"(e.g. {cells[integers[0]]!r}, lines {lines(integers)}); use one or the other, or give the class list")
    names = sorted({cells[i] for i in named})
    index = {c: i for i, c in enumerate(names)}
    return np.array([index.get(c, -1) for c in cells], dtype=np.int64), names


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
