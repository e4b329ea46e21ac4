"""The three-stage verdict rules of the Fi-ImageNet-1k protocol (paper Sec. 3, Fig. 3), as pure functions.

Stage 1: two annotators each give one verdict per image, independently:
``ood`` (with a proposed label and a fine-grained flag), ``id`` (with an ID class) or ``ambiguous``.
Stage 2: the two verdicts are compared. They *agree* when the verdicts are equal and, for ``id``,
the classes are equal too (the stricter reading: an image returned to ID needs one class).
Two ``ood`` verdicts agree whatever their labels: the paper admits agreed OOD images; the OOD
label and fine-grained flag are then those of the first Stage-1 annotator, and the second
annotator's label is kept alongside. Agreement is final; disagreement goes to Stage 3.
Stage 3: the two plus a third annotator review together; each submits a verdict, and the image
gets a verdict only on full consensus of all three (same rule as agreement), else it is
``ambiguous``. An agreed ``ood`` takes the third (Stage-3) annotator's label and flag.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["VERDICTS", "Verdict", "Outcome", "agree", "resolve", "check_verdict"]

VERDICTS = ("ood", "id", "ambiguous")


@dataclass(frozen=True)
class Verdict:
    """One annotator's verdict on one image at one stage (1 or 3)."""

    annotator: str
    verdict: str
    ood_label: str | None = None
    fine_grained: bool = False
    id_class: int | None = None
    stage: int = 1


@dataclass(frozen=True)
class Outcome:
    """Where an image stands.

    status: ``stage1`` (verdicts missing), ``stage3`` (disputed, Stage-3 verdicts missing) or ``final``.
    verdict / stage: the final verdict and the stage that decided it (2 = Stage-1 agreement, 3).
    labels: every OOD label proposed by the deciding annotators, the adopted one first.
    """

    status: str
    verdict: str | None = None
    stage: int | None = None
    ood_label: str | None = None
    fine_grained: bool = False
    id_class: int | None = None
    labels: tuple[str, ...] = ()


def check_verdict(verdict: str, ood_label: str | None, fine_grained: bool, id_class: int | None, n_classes: int | None = None) -> None:
    """Raise ValueError unless the fields fit the verdict (OOD needs a label, ID needs a class)."""
    if verdict not in VERDICTS:
        raise ValueError(f"verdict must be one of {', '.join(VERDICTS)}, got {verdict!r}")
    label = (ood_label or "").strip()
    if verdict == "ood" and not label:
        raise ValueError("an 'ood' verdict needs a proposed OOD label")
    if verdict != "ood" and (label or fine_grained):
        raise ValueError(f"an '{verdict}' verdict takes no OOD label or fine-grained flag")
    if verdict == "id":
        if id_class is None or isinstance(id_class, bool) or not isinstance(id_class, int):
            raise ValueError(f"an 'id' verdict needs an integer ID class, got {id_class!r}")
        if id_class < 0 or (n_classes is not None and id_class >= n_classes):
            raise ValueError(f"ID class {id_class} is outside 0..{(n_classes or 0) - 1}")
    elif id_class is not None:
        raise ValueError(f"an '{verdict}' verdict takes no ID class")


def agree(a: Verdict, b: Verdict) -> bool:
    """Same verdict, and for ``id`` the same class (OOD labels may differ)."""
    return a.verdict == b.verdict and (a.verdict != "id" or a.id_class == b.id_class)


def _final(verdicts: list[Verdict], chosen: Verdict, stage: int) -> Outcome:
    if chosen.verdict == "ood":
        labels = [chosen.ood_label] + [v.ood_label for v in verdicts if v is not chosen and v.ood_label != chosen.ood_label]
        return Outcome("final", "ood", stage, chosen.ood_label, chosen.fine_grained, None, tuple(dict.fromkeys(labels)))
    return Outcome("final", chosen.verdict, stage, None, False, chosen.id_class if chosen.verdict == "id" else None)


def resolve(stage1: list[Verdict], stage3: list[Verdict] | None = None) -> Outcome:
    """The outcome of one image.

    stage1: the Stage-1 verdicts in annotator order (first annotator first); fewer than two = pending.
    stage3: the Stage-3 verdicts with the third annotator LAST; fewer than three = pending.
    """
    if len(stage1) > 2:
        raise ValueError(f"Stage 1 has two annotators, got {len(stage1)} verdicts")
    if len(stage1) < 2:
        return Outcome("stage1")
    first, second = stage1
    if agree(first, second):
        return _final([first, second], first, 2)
    stage3 = stage3 or []
    if len(stage3) > 3:
        raise ValueError(f"Stage 3 has three annotators, got {len(stage3)} verdicts")
    if len(stage3) < 3:
        return Outcome("stage3")
    if all(agree(stage3[0], v) for v in stage3[1:]):
        return _final(stage3, stage3[-1], 3)
    return Outcome("final", "ambiguous", 3)
