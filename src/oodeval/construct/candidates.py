"""The candidate pool: ID images that the reannotation assigned to no class (paper Sec. 3).

Fi-ImageNet-1k starts from the 2,597 ImageNet-1k validation images ReImageNet left unassigned
(2,123 flagged "uncertain", 474 "no ImageNet-1k class"). ``select_candidates`` keeps the rows with an
empty reannotated label set; ``write_project`` stores them as ``candidates.csv`` in a work folder
with ``project.json`` recording where the inputs are and their SHA-256, for the later steps.
``load_project`` refuses inputs that changed since; once ``init`` has made the protocol store
(``pin_project`` records the pool and evidence hashes), re-running ``candidates`` is refused.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .._io import check_output, claim_folder, write_json_atomic, write_text_atomic
from ..errors import InputError
from .tables import IDManifest, Reannotation, csv_text, read_class_names, read_manifest, read_reannotation

__all__ = [
    "Candidate", "Project", "select_candidates", "flag_counts", "write_project", "load_project", "NO_FLAG",
    "pool_sha256", "evidence_sha256", "pin_project", "check_not_initialised",
]

#: the flag shown for an unassigned image whose reannotation row has an empty flag
NO_FLAG = "(no flag)"
CANDIDATE_COLUMNS = ("image", "path", "original_label", "original_name", "flag")


@dataclass(frozen=True)
class Candidate:
    """One image of the pool; ``image`` is its id (the manifest path)."""

    image: str
    path: str
    original_label: int
    original_name: str
    flag: str


def select_candidates(rows: list[Reannotation], class_names: list[str] | None = None) -> list[Candidate]:
    """The reannotation rows with an empty label set, in table order."""
    out = []
    for r in rows:
        if r.unassigned:
            name = class_names[r.original_label] if class_names and r.original_label < len(class_names) else str(r.original_label)
            out.append(Candidate(r.path, r.path, r.original_label, name, r.flag or NO_FLAG))
    return out


def flag_counts(candidates: list[Candidate]) -> dict[str, int]:
    """Number of candidates per flag, largest first (ties by name)."""
    counts = Counter(c.flag for c in candidates)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


@dataclass
class Project:
    """A construction work folder: inputs, candidates and the derived file locations."""

    folder: Path
    manifest: IDManifest
    reannotation: list[Reannotation]
    class_names: list[str] | None
    candidates: list[Candidate]
    pinned: dict = field(default_factory=dict)  # pool and evidence SHA-256 recorded by ``init``

    @property
    def evidence_dir(self) -> Path:
        return self.folder / "evidence"

    @property
    def db_path(self) -> Path:
        return self.folder / "protocol.sqlite"

    def class_name(self, label: int) -> str:
        if self.class_names and 0 <= label < len(self.class_names):
            return self.class_names[label]
        return str(label)

    @property
    def n_classes(self) -> int:
        """The class names' count, or without names one more than the largest manifest label."""
        return len(self.class_names) if self.class_names else max(self.manifest.labels) + 1


def pool_sha256(candidates: list[Candidate]) -> str:
    """SHA-256 of the pool (ids, paths, original labels, flags, in order): what a protocol store was made for."""
    h = hashlib.sha256()
    for c in candidates:
        h.update(json.dumps([c.image, c.path, c.original_label, c.flag]).encode() + b"\n")
    return h.hexdigest()


def evidence_sha256(folder: Path) -> str:
    """SHA-256 over the evidence files (names and bytes, in name order); of nothing when there are none."""
    h = hashlib.sha256()
    for f in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        h.update(f.name.encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def _file_sha256(path: str | Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def check_not_initialised(folder: str | Path, step: str) -> None:
    """ValueError when ``folder`` already has a protocol store: its pool and evidence are pinned."""
    if (Path(folder) / "protocol.sqlite").exists():
        raise InputError(
            f"{folder} is initialised (protocol.sqlite holds the verdicts of its pool); re-running `construct {step}` "
            "would split the pool or evidence from the store. Make a new work folder for new inputs"
        )


def pin_project(project: Project) -> dict:
    """Record the pool and evidence SHA-256 in ``project.json`` (done by ``init``); return the hashes."""
    meta = json.loads((project.folder / "project.json").read_text())
    meta["pinned"] = {"pool": pool_sha256(project.candidates), "evidence": evidence_sha256(project.evidence_dir)}
    write_json_atomic(project.folder / "project.json", meta)
    project.pinned = meta["pinned"]
    return meta["pinned"]


def write_project(
    folder: str | Path,
    manifest: str | Path,
    reannotation: str | Path,
    class_names: str | Path | None = None,
    root: str | Path | None = None,
) -> Project:
    """Read and check the inputs, select the pool, write ``candidates.csv`` and ``project.json``."""
    folder = Path(folder)
    check_not_initialised(folder, "candidates")
    check_output(folder, "construct project", folder=True)
    man = read_manifest(manifest, root)
    names = read_class_names(class_names) if class_names else None
    if names is not None:
        too_big = [label for label in man.labels if label >= len(names)]
        if too_big:
            raise InputError(f"{len(too_big)} manifest label(s) (e.g. {too_big[0]}) exceed the {len(names)} class names")
    rows = read_reannotation(reannotation, man, names)
    cands = select_candidates(rows, names)
    if not cands:
        raise InputError(f"reannotation table {reannotation} assigns every one of its {len(rows)} images to a class: no candidates")
    rows_out = [[c.image, c.path, c.original_label, c.original_name, c.flag] for c in cands]
    claim_folder(folder, "construct project")
    write_text_atomic(folder / "candidates.csv", csv_text(CANDIDATE_COLUMNS, rows_out))
    write_json_atomic(
        folder / "project.json",
        {
            "format": "oodeval.construct/1",
            "manifest": str(Path(manifest).resolve()),
            "reannotation": str(Path(reannotation).resolve()),
            "class_names": str(Path(class_names).resolve()) if class_names else None,
            "root": str(Path(root).resolve()) if root else None,
            "n_candidates": len(cands),
            "flags": flag_counts(cands),
            "sha256": {
                "manifest": _file_sha256(manifest), "reannotation": _file_sha256(reannotation),
                "class_names": _file_sha256(class_names) if class_names else None, "pool": pool_sha256(cands),
            },
        },
    )
    return Project(folder, man, rows, names, cands)


def load_project(folder: str | Path) -> Project:
    """Re-read the inputs recorded in ``folder/project.json`` and the candidates of ``candidates.csv``."""
    folder = Path(folder)
    meta_file = folder / "project.json"
    if not meta_file.is_file():
        raise FileNotFoundError(f"{folder} is not a construction folder (no project.json); run `oodeval construct candidates` first")
    meta = json.loads(meta_file.read_text())
    for key, digest in meta.get("sha256", {}).items():
        if key != "pool" and digest is not None and _file_sha256(meta[key]) != digest:
            raise InputError(f"the {key.replace('_', ' ')} {meta[key]} changed since `construct candidates` made {folder}; make a new work folder")
    man = read_manifest(meta["manifest"], meta.get("root"))
    names = read_class_names(meta["class_names"]) if meta.get("class_names") else None
    rows = read_reannotation(meta["reannotation"], man, names)
    with open(folder / "candidates.csv", newline="", encoding="utf-8") as fh:
        cands = [
            Candidate(r["image"], r["path"], int(r["original_label"]), r["original_name"], r["flag"])
            for r in csv.DictReader(fh)
        ]
    pinned = meta.get("sha256", {}).get("pool")
    if pinned is not None and pool_sha256(cands) != pinned:
        raise InputError(f"{folder / 'candidates.csv'} was changed after `construct candidates` wrote it; make a new work folder")
    return Project(folder, man, rows, names, cands, meta.get("pinned", {}))
