"""Reading the inputs of benchmark construction: the ID manifest, the class names, the reannotation.

ID manifest: CSV with a header and at least ``path,label`` (label = integer ID class); more
columns (e.g. ``url`` for a public image address) are kept. The same columns as
``oodeval.data.Manifest`` CSVs. Paths are resolved against ``root`` (default: the CSV's folder).

Class names: a text file with one name per line (line i = class i), or a CSV with ``label,name``.

Reannotation table: CSV with a header and the columns
``path`` (or ``image``; must match a manifest path), ``reannotated`` (the reannotated label set:
class indices or class names separated by ``;`` or ``|``; empty = assigned to no class),
``flag`` (e.g. ``uncertain`` / ``no class``; may be empty) and optionally ``original_label``
(checked against the manifest). Every problem is reported with its row numbers.
"""

from __future__ import annotations

import csv
import io
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from .._io import strip_csv_marker
from ..errors import InputError

__all__ = [
    "IDManifest", "Reannotation", "read_manifest", "read_class_names", "read_reannotation", "confusion_counts", "csv_text", "inert",
]  # fmt: skip

_SPLIT = re.compile(r"[;|]")


@dataclass
class IDManifest:
    """Rows of the ID manifest: ``paths[i]`` has class ``labels[i]``; ``extra[i]`` holds other columns."""

    paths: list[str]
    labels: list[int]
    extra: list[dict[str, str]]
    root: Path
    source: Path | None = None

    def __len__(self) -> int:
        return len(self.paths)

    def index(self) -> dict[str, int]:
        """path -> row number."""
        return {p: i for i, p in enumerate(self.paths)}

    def resolve(self, path: str) -> Path:
        """The file behind a manifest path (absolute paths are kept, relative ones joined to root)."""
        p = Path(path)
        return p if p.is_absolute() else self.root / p


@dataclass
class Reannotation:
    """One reannotated image: its manifest path, original label, reannotated set and flag."""

    path: str
    original_label: int
    labels: tuple[int, ...]
    flag: str
    row: int = 0
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def unassigned(self) -> bool:
        """True when the reannotation assigned the image to no class."""
        return not self.labels


def _read_csv(path: Path, what: str) -> tuple[list[str], list[dict[str, str]]]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} does not exist")
    try:
        text = strip_csv_marker(path.read_text(encoding="utf-8-sig"))  # a Manifest.to_csv file starts with oodeval's marker
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8 CSV") from exc
    with io.StringIO(text, newline="") as fh:
        reader = csv.DictReader(fh)
        if not reader.fieldnames:
            raise InputError(f"{what} {path} is empty (no header row)")
        header = [h.strip() for h in reader.fieldnames]
        rows = []
        for row in reader:
            if None in row:
                raise InputError(f"{what} {path} row {reader.line_num}: more fields than the {len(header)} header columns")
            rows.append({k.strip(): (v or "").strip() for k, v in row.items()})
    return header, rows


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def inert(text: str | None) -> str:
    """A text cell a spreadsheet will not run: one starting with ``= + - @``, tab or CR gets a leading ``'``
    (OWASP's CSV-injection advice); None is ``""``."""
    text = text or ""
    return "'" + text if text.startswith(FORMULA_START) else text


def csv_text(header: list[str] | tuple[str, ...], rows: list[list]) -> str:
    """CSV text (``\\n`` line ends) of a header and rows, for writing with ``write_text_atomic``."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    return buf.getvalue()


def _parse_int(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def _report(what: str, path: Path, problems: list[str]) -> None:
    if problems:
        shown = "; ".join(problems[:5])
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise InputError(f"{what} {path}: {len(problems)} problem(s): {shown}{more}")


def read_manifest(path: str | Path, root: str | Path | None = None) -> IDManifest:
    """Read an ID manifest CSV (``path,label[,...]``); labels must be integers >= 0, paths unique."""
    path = Path(path)
    header, rows = _read_csv(path, "ID manifest")
    missing = [c for c in ("path", "label") if c not in header]
    if missing:
        raise InputError(f"ID manifest {path} lacks column(s) {', '.join(missing)} (has {', '.join(header)})")
    problems, paths, labels, extra = [], [], [], []
    seen: dict[str, int] = {}
    for i, row in enumerate(rows, start=2):
        label = _parse_int(row["label"])
        if not row["path"]:
            problems.append(f"row {i} has an empty path")
        if label is None or label < 0:
            problems.append(f"row {i} label {row['label']!r} is not a class index >= 0")
        if row["path"] in seen:
            problems.append(f"row {i} repeats path {row['path']!r} of row {seen[row['path']]}")
        seen[row["path"]] = i
        paths.append(row["path"])
        labels.append(label if label is not None else -1)
        extra.append({k: v for k, v in row.items() if k not in ("path", "label")})
    if not rows:
        problems.append("no rows")
    _report("ID manifest", path, problems)
    return IDManifest(paths, labels, extra, Path(root) if root else path.parent, path)


def read_class_names(path: str | Path) -> list[str]:
    """Class names: one per line (``.txt``) or a CSV with ``label,name`` covering 0..C-1."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"class-name file {path} does not exist")
    if path.suffix.lower() == ".csv":
        header, rows = _read_csv(path, "class-name table")
        if "label" not in header or "name" not in header:
            raise InputError(f"class-name table {path} needs columns label,name (has {', '.join(header)})")
        by_label = {}
        for i, row in enumerate(rows, start=2):
            label = _parse_int(row["label"])
            if label is None or label < 0 or label in by_label:
                raise InputError(f"class-name table {path} row {i}: label {row['label']!r} is not a new index >= 0")
            by_label[label] = row["name"]
        if sorted(by_label) != list(range(len(by_label))):
            raise InputError(f"class-name table {path} must cover labels 0..{len(by_label) - 1} without gaps")
        return [by_label[i] for i in range(len(by_label))]
    names = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    while names and not names[-1]:
        names.pop()
    if not names or any(not n for n in names):
        raise InputError(f"class-name file {path} must have one non-empty name per line")
    return names


def read_reannotation(path: str | Path, manifest: IDManifest, class_names: list[str] | None = None) -> list[Reannotation]:
    """Read and check the reannotation table against the manifest (see the module docstring)."""
    path = Path(path)
    header, rows = _read_csv(path, "reannotation table")
    key = "path" if "path" in header else "image" if "image" in header else None
    missing = [c for c in ("reannotated", "flag") if c not in header]
    if key is None:
        missing.insert(0, "path (or image)")
    if missing:
        raise InputError(f"reannotation table {path} lacks column(s) {', '.join(missing)} (has {', '.join(header)})")
    by_name = {n: i for i, n in enumerate(class_names)} if class_names else {}
    n_classes = len(class_names) if class_names else None
    index = manifest.index()
    problems: list[str] = []
    out: list[Reannotation] = []
    seen: dict[str, int] = {}
    unknown = 0
    for i, row in enumerate(rows, start=2):
        image = row[key]
        if image not in index:
            unknown += 1
            if unknown <= 3:
                problems.append(f"row {i} image {image!r} is not in the ID manifest")
            continue
        if image in seen:
            problems.append(f"row {i} repeats image {image!r} of row {seen[image]}")
            continue
        seen[image] = i
        original = manifest.labels[index[image]]
        if row.get("original_label"):
            given = _parse_int(row["original_label"])
            if given is None:
                given = by_name.get(row["original_label"])
            if given != original:
                problems.append(f"row {i} original_label {row['original_label']!r} differs from the manifest label {original}")
        labels = []
        for token in (t.strip() for t in _SPLIT.split(row["reannotated"])):
            if not token:
                continue
            label = _parse_int(token)
            if label is None:
                label = by_name.get(token)
            if label is None or label < 0 or (n_classes is not None and label >= n_classes):
                problems.append(f"row {i} reannotated label {token!r} is not a known class")
                continue
            labels.append(label)
        extra = {k: v for k, v in row.items() if k not in (key, "reannotated", "flag", "original_label")}
        out.append(Reannotation(image, original, tuple(sorted(set(labels))), row["flag"], i, extra))
    if unknown > 3:
        problems.append(f"{unknown} image(s) in total are not in the ID manifest")
    if not rows:
        problems.append("no rows")
    _report("reannotation table", path, problems)
    return out


def confusion_counts(rows: list[Reannotation]) -> dict[int, Counter]:
    """Evidence (E): for each original class c, how often reannotators assigned each other class.

    counts[c][l] = number of images with original label c whose reannotated set contains l != c.
    """
    counts: dict[int, Counter] = defaultdict(Counter)
    for r in rows:
        for label in r.labels:
            if label != r.original_label:
                counts[r.original_label][label] += 1
    return dict(counts)
