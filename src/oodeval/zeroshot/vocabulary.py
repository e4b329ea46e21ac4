"""Negative vocabularies as objects: labels, kind, provenance and a content hash, saved as JSON.

The content hash is blake2b over (kind, labels in order), so two vocabularies with the same labels in
the same order and kind hash alike whatever their provenance. ``union`` keeps first occurrences in
order; ``oracle`` reads a benchmark manifest's OOD labels.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .._io import hash_json, strip_csv_marker, write_json_atomic
from ..errors import InputError

__all__ = ["Vocabulary", "union", "oracle", "KINDS"]

KINDS = ("wordnet", "negmined", "llm-siblings", "eoe", "union", "oracle", "custom", "csp")


def _content_hash(kind: str, labels: Sequence[str]) -> str:
    return hash_json({"kind": kind, "labels": list(labels)})


@dataclass
class Vocabulary:
    """A list of distinct labels with how it was made. ``content_hash`` is filled in when empty."""

    labels: list[str]
    kind: str
    provenance: dict = field(default_factory=dict)
    content_hash: str = ""

    def __post_init__(self) -> None:
        self.labels = [str(label) for label in self.labels]
        if self.kind not in KINDS:
            raise InputError(f"unknown vocabulary kind {self.kind!r}; known: {', '.join(KINDS)}")
        dup = len(self.labels) - len(set(self.labels))
        if dup:
            repeated = [x for x, n in Counter(self.labels).items() if n > 1]
            raise InputError(f"vocabulary has {dup} repeated labels, e.g. {repeated[:3]}")
        expected = _content_hash(self.kind, self.labels)
        if self.content_hash and self.content_hash != expected:
            raise InputError(f"content hash {self.content_hash} does not match the labels ({expected})")
        self.content_hash = expected

    def __len__(self) -> int:
        return len(self.labels)

    def prefix(self, m: int) -> Vocabulary:
        """The first ``m`` labels (the M of NegMining: the m least ID-like)."""
        if m < 0:
            raise InputError(f"prefix size must be >= 0, got {m}")
        return Vocabulary(self.labels[:m], self.kind, {**self.provenance, "prefix_of": self.content_hash, "M": m})

    def save(self, path: str | Path) -> None:
        """Write as JSON atomically; an existing file is replaced only when it carries oodeval's vocabulary marker."""
        write_json_atomic(path, {"kind": self.kind, "content_hash": self.content_hash, "size": len(self),
                                 "provenance": self.provenance, "labels": self.labels}, "vocabulary")

    @classmethod
    def load(cls, path: str | Path) -> Vocabulary:
        """Read a ``.json`` written by :meth:`save` (the hash is checked), or any other file as text
        with one label per line: blank lines dropped, repeated labels kept once (first occurrence), kind "custom"."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"vocabulary file {path} does not exist")
        try:
            text = path.read_text(encoding="utf-8-sig")
        except UnicodeDecodeError as exc:
            raise InputError(f"vocabulary file {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from exc
        if path.suffix.lower() != ".json":
            lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
            labels = list(dict.fromkeys(lines))
            if not labels:
                raise InputError(f"vocabulary file {path} has no labels")
            return cls(labels, "custom", {"file": str(path), "repeated_labels_dropped": len(lines) - len(labels)})
        try:
            data = json.loads(text)
            return cls(data["labels"], data["kind"], data.get("provenance", {}), data.get("content_hash", ""))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise InputError(f"vocabulary file {path} is not a Vocabulary JSON (keys labels, kind): {exc}") from exc
        except ValueError as exc:  # a content hash that does not match the labels, a repeated label, an unknown kind
            raise InputError(f"vocabulary file {path}: {exc}; the file was changed after it was written: rebuild it with `oodeval vocab`") from exc


def union(vocabularies: Sequence[Vocabulary]) -> Vocabulary:
    """Labels of all vocabularies, first occurrence kept, in the order given (e.g. WN then GPT)."""
    if not vocabularies:
        raise InputError("union of zero vocabularies")
    labels = list(dict.fromkeys(label for v in vocabularies for label in v.labels))
    prov = {"parts": [{"kind": v.kind, "content_hash": v.content_hash, "size": len(v)} for v in vocabularies]}
    return Vocabulary(labels, "union", prov)


def oracle(manifest: str | Path, column: str = "ood_label", exclude: Sequence[str] = ()) -> Vocabulary:
    """The distinct non-empty OOD labels of a benchmark manifest (CSV/TSV/Parquet/JSONL), first-seen order.

    ``exclude`` (e.g. the ID names) is removed: a negative equal to an ID name would cancel itself.
    """
    import pandas as pd

    manifest = Path(manifest)
    if not manifest.is_file():
        raise FileNotFoundError(f"manifest {manifest} does not exist")
    suffix = manifest.suffix.lower()
    if suffix == ".parquet":
        df = pd.read_parquet(manifest)
    elif suffix in (".jsonl", ".json"):
        df = pd.read_json(manifest, lines=suffix == ".jsonl")
    else:
        try:
            text = strip_csv_marker(manifest.read_text(encoding="utf-8-sig"))  # Manifest.to_csv writes oodeval's marker first
        except UnicodeDecodeError as exc:
            raise InputError(f"manifest {manifest} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from exc
        df = pd.read_csv(io.StringIO(text), sep="\t" if suffix == ".tsv" else ",", dtype=str, keep_default_na=False)
    if column not in df.columns:
        raise InputError(f"manifest {manifest} has no column {column!r}; columns: {', '.join(map(str, df.columns))}")
    values = [str(v).strip() for v in df[column].tolist() if v is not None and str(v).strip() not in ("", "nan", "None")]
    drop = {e.strip().lower() for e in exclude}
    labels = [v for v in dict.fromkeys(values) if v.lower() not in drop]
    return Vocabulary(labels, "oracle", {"manifest": str(manifest), "column": column, "rows": len(df),
                                         "excluded": len(dict.fromkeys(values)) - len(labels)})
