"""Export of a finished protocol: benchmark manifests and the outcome table (paper Sec. 3 "Outcome").

Files written (atomically) into the export folder:
``ood.csv``         the OOD set: path,label(-1),ood_label,fine_grained,original_label,original_name,flag,decided_stage,other_labels,ood_sense
                    (ood_label: the agreed label; other_labels: the other spellings the annotators used;
                    ood_sense: the agreed WordNet noun synset, empty for a free label)
                    (same leading columns as an ``oodeval.data.Manifest`` CSV, so ``oodeval run`` reads it);
Paths are written relative to the export folder (absolute when on another drive), so
``Manifest.from_csv`` finds the images and the folder can move together with them.
``returned_id.csv`` images resolved to an ID class: path,label,original_label,original_name,flag,decided_stage;
``ambiguous.csv``   images without a verdict: path,original_label,original_name,flag,decided_stage;
``id_eval.csv``     the ID evaluation set: path,label,class_name for every ID-manifest image that is
                    neither OOD nor ambiguous (nor pending), returned images carrying their verified
                    class (the paper's 48,365 images);
``outcome.csv`` / ``outcome.md`` counts and shares of OOD / ID / ambiguous per flag and overall, with
                    distinct OOD concepts (:func:`.rules.concept`, the consensus rule) and the fine-grained
                    share of the OOD images.
Text cells a spreadsheet would run as a formula (starting with ``=``, ``+``, ``-``, ``@``, tab or
carriage return) are written with a leading ``'`` (:func:`.tables.inert`); paths and numbers as they are.
The store records each export, so a later reopening of an image it included says it is stale.
"""

from __future__ import annotations

import os
from pathlib import Path

from .._io import claim_folder, write_text_atomic
from ..errors import InputError
from .candidates import Project
from .protocol import ProtocolStore
from .rules import Outcome, concept
from .tables import csv_text, inert

__all__ = ["outcome_table", "format_outcome", "export"]

OUTCOME_COLUMNS = (
    "flag", "candidates", "ood", "ood_share", "id", "id_share", "ambiguous", "ambiguous_share",
    "pending", "ood_concepts", "fine_grained", "fine_grained_share",
)


RULE = (
    "Consensus rule: an image gets a verdict when both Stage-1 annotators agree (Stage 2) or, after any difference, "
    "all three agree in Stage 3; agreement means the same verdict, for ID the same class, for OOD the same concept "
    "(the same WordNet noun sense when the annotators chose one, else the same label up to case, spacing, '_' and '-') "
    "and the same fine-grained flag. Otherwise the image is ambiguous. OOD concepts are counted by the same rule. "
    "OOD images carry the agreed label as first written (other spellings in other_labels)."
)


def _share(a: int, b: int) -> float:
    return a / b if b else 0.0


def outcome_table(flags: dict[str, str], outcomes: dict[str, Outcome]) -> list[dict]:
    """One row per flag (largest group first) and a final ``all`` row.

    Shares are fractions of the row's candidates; fine_grained_share is a fraction of its OOD images.
    """
    groups: dict[str, list[str]] = {}
    for image, flag in flags.items():
        groups.setdefault(flag, []).append(image)
    order = sorted(groups, key=lambda f: (-len(groups[f]), f))
    rows = []
    for flag, images in [(f, groups[f]) for f in order] + [("all", list(flags))]:
        outs = [outcomes[i] for i in images]
        final = [o for o in outs if o.status == "final"]
        ood = [o for o in final if o.verdict == "ood"]
        n_id = sum(o.verdict == "id" for o in final)
        n_amb = sum(o.verdict == "ambiguous" for o in final)
        fine = sum(o.fine_grained for o in ood)
        n = len(images)
        rows.append({
            "flag": flag, "candidates": n,
            "ood": len(ood), "ood_share": _share(len(ood), n),
            "id": n_id, "id_share": _share(n_id, n),
            "ambiguous": n_amb, "ambiguous_share": _share(n_amb, n),
            "pending": n - len(final),
            "ood_concepts": len({concept(o.ood_label, o.ood_sense) for o in ood}),
            "fine_grained": fine, "fine_grained_share": _share(fine, len(ood)),
        })
    return rows


def format_outcome(rows: list[dict]) -> str:
    """The outcome table as Markdown, counts with percentages as in the paper."""
    lines = [
        "| flag | candidates | OOD | returned to ID | ambiguous | pending | OOD concepts | fine-grained (of OOD) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['flag']} | {r['candidates']} | {r['ood']} ({100 * r['ood_share']:.1f}%) | {r['id']} ({100 * r['id_share']:.1f}%)"
            f" | {r['ambiguous']} ({100 * r['ambiguous_share']:.1f}%) | {r['pending']} | {r['ood_concepts']}"
            f" | {r['fine_grained']}/{r['ood']} ({100 * r['fine_grained_share']:.1f}%) |"
        )
    return "\n".join(lines) + "\n\n" + RULE + "\n"


def export(project: Project, store: ProtocolStore, out: str | Path | None = None, allow_pending: bool = False) -> dict[str, Path]:
    """Write the files listed in the module docstring; return name -> path.

    Refuses (ValueError) while images are still pending unless ``allow_pending`` (pending images
    are then left out of every list and counted in the table's ``pending`` column). ``out`` is
    created, or rewritten when it is an earlier export; any other existing path is refused.
    """
    outcomes = store.outcomes()
    pending = [i for i, o in outcomes.items() if o.status != "final"]
    if pending and not allow_pending:
        raise InputError(f"{len(pending)} of {len(outcomes)} images are still pending (e.g. {pending[0]!r}); finish them or pass --allow-pending")
    out = claim_folder(out or project.folder / "export", "construct export")
    images = {c.image: c for c in store.images()}
    man = project.manifest

    def rel(path: str) -> str:
        target = os.path.abspath(man.resolve(path))
        try:
            return os.path.relpath(target, os.path.abspath(out))
        except ValueError:
            return target

    ood, back, amb = [], [], []
    for image, o in outcomes.items():
        c = images[image]
        if o.status != "final":
            continue
        if o.verdict == "ood":
            ood.append([rel(c.path), -1, inert(o.ood_label), int(o.fine_grained), c.original_label, inert(c.original_name), inert(c.flag),
                        o.stage, inert("; ".join(o.labels[1:])), o.ood_sense or ""])
        elif o.verdict == "id":
            back.append([rel(c.path), o.id_class, c.original_label, inert(c.original_name), inert(c.flag), o.stage])
        else:
            amb.append([rel(c.path), c.original_label, inert(c.original_name), inert(c.flag), o.stage])
    final_label = {images[i].path: o.id_class for i, o in outcomes.items() if o.status == "final" and o.verdict == "id"}
    excluded = {images[i].path for i, o in outcomes.items() if o.status != "final" or o.verdict != "id"}
    id_rows = []
    for p, lab in zip(man.paths, man.labels):
        if p not in excluded:
            label = final_label.get(p, lab)
            id_rows.append([rel(p), label, inert(project.class_name(label))])
    table = outcome_table({i: c.flag for i, c in images.items()}, outcomes)
    files = {
        "ood": ("ood.csv", csv_text(["path", "label", "ood_label", "fine_grained", "original_label", "original_name", "flag", "decided_stage",
                                     "other_labels", "ood_sense"], ood)),
        "returned_id": ("returned_id.csv", csv_text(["path", "label", "original_label", "original_name", "flag", "decided_stage"], back)),
        "ambiguous": ("ambiguous.csv", csv_text(["path", "original_label", "original_name", "flag", "decided_stage"], amb)),
        "id_eval": ("id_eval.csv", csv_text(["path", "label", "class_name"], id_rows)),
        "outcome": ("outcome.csv", csv_text(OUTCOME_COLUMNS, [[inert(r[k]) if isinstance(r[k], str) else f"{r[k]:.6f}" if isinstance(r[k], float)
                                                               else r[k] for k in OUTCOME_COLUMNS] for r in table])),
        "outcome_md": ("outcome.md", format_outcome(table)),
    }
    paths = {}
    for key, (name, text) in files.items():
        write_text_atomic(out / name, text)
        paths[key] = out / name
    store.record_export(out)
    return paths
