"""The three-stage verdict rules of the Fi-ImageNet-1k protocol (paper Sec. 3, Fig. 3), as pure functions.

Stage 1: two annotators each give one verdict per image, independently:
``ood`` (with a proposed label, optionally the WordNet noun sense the annotator means, and a
fine-grained flag), ``id`` (with an ID class) or ``ambiguous``.
Stage 2: the two verdicts are compared. They *agree* when the verdicts are equal and, for ``id``,
the classes are equal; for ``ood``, the labels name the same concept (:func:`concept`: the same
WordNet noun synset when both annotators chose one, else the same label after :func:`normalise_label`;
a label with a sense never matches a free one) and the fine-grained flags are equal. The paper admits
an image only "if the consensus among annotators is reached", with a verified OOD label, so any
difference (label or flag included) goes to Stage 3; agreement is final.
Stage 3: the two plus a third annotator review together; each submits a verdict, and the image
gets a verdict only when all three agree pairwise (same rule), else it is ``ambiguous``.
An agreed ``ood`` carries the label as the first deciding annotator wrote it (all spellings kept).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import InputError

__all__ = ["VERDICTS", "MAX_LABEL", "Verdict", "Outcome", "agree", "differences", "resolve_verdicts", "check_verdict", "normalise_label",
           "concept", "SenseLemmas", "check_text"]

VERDICTS = ("ood", "id", "ambiguous")
MAX_LABEL = 200  # characters of an OOD label
WNID = re.compile(r"n[0-9]{8}")


@dataclass(frozen=True)
class Verdict:
    """One annotator's verdict on one image at one stage (1 or 3)."""

    annotator: str
    verdict: str
    ood_label: str | None = None
    fine_grained: bool = False
    id_class: int | None = None
    stage: int = 1
    ood_sense: str | None = None  # WordNet noun synset the label means (``n02451415``), None = free label


@dataclass(frozen=True)
class Outcome:
    """Where an image stands.

    status: ``stage1`` (verdicts missing), ``stage3`` (disputed, Stage-3 verdicts missing) or ``final``.
    verdict / stage: the final verdict and the stage that decided it (2 = Stage-1 agreement, 3).
    labels: every spelling of the agreed OOD label among the deciding verdicts, the adopted one first.
    ood_sense: the agreed WordNet noun synset, None for a free label.
    """

    status: str
    verdict: str | None = None
    stage: int | None = None
    ood_label: str | None = None
    fine_grained: bool = False
    id_class: int | None = None
    labels: tuple[str, ...] = ()
    ood_sense: str | None = None


SenseLemmas = Callable[[str], Sequence[str] | None]  # wnid -> the synset's lemmas, None if there is no such noun synset


def check_text(**fields: object) -> None:
    """Raise InputError naming every text value among ``fields`` that is not valid Unicode: a lone
    surrogate (U+D800-U+DFFF, which JSON's ``\\ud800`` escape and undecodable command-line bytes
    make) can be neither stored in UTF-8 nor shown. Values that are not ``str`` are not looked at."""
    bad = []
    for name, value in fields.items():
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                bad.append(name)
    if bad:
        raise InputError(f"{', '.join(bad)}: not Unicode text (a lone surrogate, \\ud800-\\udfff); give the characters themselves")


def check_verdict(verdict: str, ood_label: str | None, fine_grained: bool, id_class: int | None, n_classes: int | None = None,
                  ood_sense: str | None = None, class_names: Sequence[str] | None = None, sense_lemmas: SenseLemmas | None = None) -> None:
    """Raise ValueError unless the fields fit the verdict (OOD needs a label, ID needs a class).

    An OOD label must keep a letter or digit after :func:`normalise_label`, be at most ``MAX_LABEL``
    characters, and not name an ID class (a class name, or one of its comma-separated names).
    ood_sense: a WordNet noun synset id whose lemmas include the label and no ID class name; refused when
    ``sense_lemmas`` (wnid -> lemmas) is None (the store compares labels without WordNet).
    """
    if verdict not in VERDICTS:
        raise InputError(f"verdict must be one of {', '.join(VERDICTS)}, got {verdict!r}")
    label = (ood_label or "").strip()
    if verdict == "ood" and not label:
        raise InputError("an 'ood' verdict needs a proposed OOD label")
    if verdict != "ood" and (label or fine_grained or ood_sense):
        raise InputError(f"an '{verdict}' verdict takes no OOD label, sense or fine-grained flag")
    if verdict == "ood":
        _check_label(label, ood_sense, class_names, sense_lemmas)
    if verdict == "id":
        if id_class is None or isinstance(id_class, bool) or not isinstance(id_class, int):
            raise InputError(f"an 'id' verdict needs an integer ID class, got {id_class!r}")
        if id_class < 0 or (n_classes is not None and id_class >= n_classes):
            raise InputError(f"ID class {id_class} is outside 0..{(n_classes or 0) - 1}")
    elif id_class is not None:
        raise InputError(f"an '{verdict}' verdict takes no ID class")


def _id_names(class_names: Sequence[str]) -> dict[str, int]:
    """Normalised ID class name (whole, and each comma-separated part) -> class index."""
    out: dict[str, int] = {}
    for i, name in enumerate(class_names):
        for part in [name, *name.split(",")]:
            out.setdefault(normalise_label(part), i)
    out.pop("", None)
    return out


def _check_label(label: str, sense: str | None, class_names: Sequence[str] | None, sense_lemmas: SenseLemmas | None) -> None:
    if len(label) > MAX_LABEL:
        raise InputError(f"an OOD label has at most {MAX_LABEL} characters, got {len(label)}")
    norm = normalise_label(label)
    if not any(ch.isalnum() for ch in norm):
        raise InputError(f"OOD label {label!r} has no letter or digit once case, spacing, '_', '-' and invisible characters are removed")
    names = _id_names(class_names or ())
    if norm in names:
        raise InputError(f"OOD label {label!r} names ID class {names[norm]} ({class_names[names[norm]]!r}): "
                         "an image of an ID class gets an 'id' verdict")
    if sense is None:
        return
    if sense_lemmas is None:
        raise InputError("this store compares OOD labels without WordNet: give the label without a sense")
    if not isinstance(sense, str) or not WNID.fullmatch(sense):
        raise InputError(f"a sense is a WordNet noun synset id like n02451415, got {sense!r}")
    lemmas = sense_lemmas(sense)
    if lemmas is None:
        raise InputError(f"WordNet has no noun synset {sense}")
    normed = [normalise_label(lemma) for lemma in lemmas]
    if norm not in normed:
        raise InputError(f"OOD label {label!r} is not a name of WordNet sense {sense} ({', '.join(lemmas)})")
    hit = next((n for n in normed if n in names), None)
    if hit is not None:
        raise InputError(f"WordNet sense {sense} ({', '.join(lemmas)}) includes ID class {names[hit]} ({class_names[names[hit]]!r}): "
                         "an image of an ID class gets an 'id' verdict")


def normalise_label(label: str | None) -> str:
    """NFKC, invisible (format) characters dropped, ``_`` and ``-`` read as spaces, case-folded, single-spaced.

    ``Denison_barb`` = ``denison barb``; ``-``, ``_`` and a lone zero-width space normalise to ``""``.
    """
    text = unicodedata.normalize("NFKC", label or "")
    text = "".join(ch for ch in text if unicodedata.category(ch) != "Cf")
    return " ".join(text.replace("_", " ").replace("-", " ").casefold().split())


def concept(label: str | None, sense: str | None = None) -> tuple[str, str]:
    """What an OOD label means: ``("sense", wnid)`` when the annotator chose a WordNet noun sense,
    else ``("label", normalised label)`` (a free label matches only the same free label)."""
    return ("sense", sense) if sense else ("label", normalise_label(label))


def differences(verdicts: list[Verdict]) -> list[str]:
    """The fields on which the verdicts differ: ``verdict``, ``ood_label`` (the concept), ``fine_grained``, ``id_class``."""
    out = []
    if len({v.verdict for v in verdicts}) > 1:
        out.append("verdict")
    ood = [v for v in verdicts if v.verdict == "ood"]
    if len({concept(v.ood_label, v.ood_sense) for v in ood}) > 1:
        out.append("ood_label")
    if len({v.fine_grained for v in ood}) > 1:
        out.append("fine_grained")
    if len({v.id_class for v in verdicts if v.verdict == "id"}) > 1:
        out.append("id_class")
    return out


def agree(a: Verdict, b: Verdict) -> bool:
    """Same verdict; for ``id`` the same class; for ``ood`` the same concept (:func:`concept`) and the same flag."""
    return not differences([a, b])


def _final(verdicts: list[Verdict], stage: int) -> Outcome:
    first = verdicts[0]
    if first.verdict == "ood":
        labels = tuple(dict.fromkeys(v.ood_label for v in verdicts))
        return Outcome("final", "ood", stage, first.ood_label, first.fine_grained, None, labels, first.ood_sense)
    return Outcome("final", first.verdict, stage, None, False, first.id_class if first.verdict == "id" else None)


def resolve_verdicts(stage1: list[Verdict], stage3: list[Verdict] | None = None) -> Outcome:
    """The outcome of one image.

    stage1: the Stage-1 verdicts in annotator order (first annotator first); fewer than two = pending.
    stage3: the Stage-3 verdicts in annotator order; fewer than three = pending.
    """
    if len(stage1) > 2:
        raise InputError(f"Stage 1 has two annotators, got {len(stage1)} verdicts")
    if len(stage1) < 2:
        return Outcome("stage1")
    if agree(*stage1):
        return _final(stage1, 2)
    stage3 = stage3 or []
    if len(stage3) > 3:
        raise InputError(f"Stage 3 has three annotators, got {len(stage3)} verdicts")
    if len(stage3) < 3:
        return Outcome("stage3")
    if not differences(stage3):
        return _final(stage3, 3)
    return Outcome("final", "ambiguous", 3)
