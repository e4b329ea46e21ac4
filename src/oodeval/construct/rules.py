"""The three-stage verdict rules of the Fi-ImageNet-1k protocol (paper Sec. 3, Fig. 3), as pure functions.

Stage 1: two annotators each give one verdict per image, independently:
``ood`` (with a proposed label and a fine-grained flag), ``id`` (with an ID class) or ``ambiguous``.
Stage 2: the two verdicts are compared. They *agree* when the verdicts are equal and, for ``id``,
the classes are equal; for ``ood``, the labels name the same concept (equal after normalising case
and whitespace, or WordNet synonyms when a synonym function is given) and the fine-grained flags are
equal. The paper admits an image only "if the consensus among annotators is reached", with a verified
OOD label, so any difference (label or flag included) goes to Stage 3; agreement is final.
Stage 3: the two plus a third annotator review together; each submits a verdict, and the image
gets a verdict only when all three agree pairwise (same rule), else it is ``ambiguous``.
An agreed ``ood`` carries the label as the first deciding annotator wrote it (all spellings kept).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import combinations

__all__ = ["VERDICTS", "Verdict", "Outcome", "agree", "differences", "resolve", "check_verdict", "normalise_label", "same_label"]

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
    labels: every spelling of the agreed OOD label among the deciding verdicts, the adopted one first.
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


def normalise_label(label: str | None) -> str:
    """Case-folded, single-spaced label; ``_`` and ``-`` read as spaces (``Denison_barb`` = ``denison barb``)."""
    return " ".join((label or "").replace("_", " ").replace("-", " ").casefold().split())


Synonyms = Callable[[str], Iterable[str]]


def same_label(a: str | None, b: str | None, synonyms: Synonyms | None = None) -> bool:
    """Two OOD labels name the same concept: equal after :func:`normalise_label`, or WordNet synonyms.

    synonyms: normalised label -> its normalised synonyms (e.g. ``oodeval.zeroshot.wordnet.synonyms``).
    """
    na, nb = normalise_label(a), normalise_label(b)
    if na == nb:
        return True
    return synonyms is not None and (nb in {normalise_label(s) for s in synonyms(na)} or na in {normalise_label(s) for s in synonyms(nb)})


def differences(verdicts: list[Verdict], synonyms: Synonyms | None = None) -> list[str]:
    """The fields on which the verdicts differ: ``verdict``, ``ood_label``, ``fine_grained``, ``id_class``."""
    out = []
    if len({v.verdict for v in verdicts}) > 1:
        out.append("verdict")
    ood = [v for v in verdicts if v.verdict == "ood"]
    if any(not same_label(a.ood_label, b.ood_label, synonyms) for a, b in combinations(ood, 2)):
        out.append("ood_label")
    if len({v.fine_grained for v in ood}) > 1:
        out.append("fine_grained")
    if len({v.id_class for v in verdicts if v.verdict == "id"}) > 1:
        out.append("id_class")
    return out


def agree(a: Verdict, b: Verdict, synonyms: Synonyms | None = None) -> bool:
    """Same verdict; for ``id`` the same class; for ``ood`` the same label (normalised) and the same flag."""
    return not differences([a, b], synonyms)


def _final(verdicts: list[Verdict], stage: int) -> Outcome:
    first = verdicts[0]
    if first.verdict == "ood":
        labels = tuple(dict.fromkeys(v.ood_label for v in verdicts))
        return Outcome("final", "ood", stage, first.ood_label, first.fine_grained, None, labels)
    return Outcome("final", first.verdict, stage, None, False, first.id_class if first.verdict == "id" else None)


def resolve(stage1: list[Verdict], stage3: list[Verdict] | None = None, synonyms: Synonyms | None = None) -> Outcome:
    """The outcome of one image.

    stage1: the Stage-1 verdicts in annotator order (first annotator first); fewer than two = pending.
    stage3: the Stage-3 verdicts in annotator order; fewer than three = pending.
    synonyms: see :func:`same_label` (None: labels agree only when equal after normalising).
    """
    if len(stage1) > 2:
        raise ValueError(f"Stage 1 has two annotators, got {len(stage1)} verdicts")
    if len(stage1) < 2:
        return Outcome("stage1")
    if agree(*stage1, synonyms=synonyms):
        return _final(stage1, 2)
    stage3 = stage3 or []
    if len(stage3) > 3:
        raise ValueError(f"Stage 3 has three annotators, got {len(stage3)} verdicts")
    if len(stage3) < 3:
        return Outcome("stage3")
    if not differences(stage3, synonyms):
        return _final(stage3, 3)
    return Outcome("final", "ambiguous", 3)
