"""Vocabulary builders that need a text encoder: NegMined WordNet (paper Sec. 4.4)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from ..errors import InputError
from .imagenet import class_names, wnids
from .negmining import rank_candidates
from .text import TextEncoder
from .vocabulary import Vocabulary
from .wordnet import DEFAULT_WORDNET, head_lemmas

__all__ = ["build_wordnet", "read_id_names", "prompt_names"]

_WNID = re.compile(r"^n\d{8}$")


def prompt_names(names: Sequence[str], source: str) -> list[str]:
    """Class names fit to be prompt text: ImageNet-1k wnids (``n01440764``) are mapped to their curated
    names (``zeroshot.imagenet``); a wnid outside ImageNet-1k, or a list mixing wnids and names, is refused."""
    names = [str(n) for n in names]
    wn = [n for n in names if _WNID.match(n)]
    if not wn:
        return names
    if len(wn) != len(names):
        raise InputError(f"ID names from {source} mix {len(wn)} WordNet ids (e.g. {wn[0]!r}) with names; "
                         "give names only (a file, one per line, or 'imagenet1k')")

    index = {w: i for i, w in enumerate(wnids())}
    unknown = [w for w in names if w not in index]
    if unknown:
        raise InputError(f"ID names from {source} are WordNet ids, {len(unknown)} not in ImageNet-1k (e.g. {unknown[:3]}): "
                         "wnids are never used as prompt text; give the class names in a file (one per line)")
    curated = class_names()
    return [curated[index[w]] for w in names]


def read_id_names(spec: str) -> tuple[list[str], list[str] | None]:
    """``imagenet1k`` -> (the 1000 unique curated names, wnids); a file -> (one name per line, None).

    A file of ImageNet-1k wnids gives their curated names (``prompt_names``)."""
    if spec == "imagenet1k":
        return list(class_names()), list(wnids())
    path = Path(spec)
    if not path.is_file():
        raise FileNotFoundError(f"ID names: {spec!r} is neither 'imagenet1k' nor an existing file")
    try:
        names = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except UnicodeDecodeError as exc:
        raise InputError(f"ID names file {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from exc
    if not names:
        raise InputError(f"ID names file {path} has no names")
    dup = len(names) - len(set(names))
    if dup:
        repeated = [n for n, count in Counter(names).items() if count > 1]
        raise InputError(f"ID names file {path} repeats {dup} names, e.g. {repeated[:3]}")
    return prompt_names(names, str(path)), None


def build_wordnet(
    encoder: TextEncoder,
    id_names: Sequence[str],
    m: int | None = 5000,
    folder: str | Path = DEFAULT_WORDNET,
    percentile: float = 95.0,
    exclude_id: bool = True,
    progress: bool = True,
) -> Vocabulary:
    """NegMined WordNet lexicon: the ``m`` head lemmas least similar to the ID names (all, ranked, when None).

    ``exclude_id`` drops lexicon entries equal (case-insensitively) to an ID name before mining.
    """
    lexicon = head_lemmas(folder)
    banned = {n.lower() for n in id_names} if exclude_id else set()
    candidates = [w for w in lexicon if w not in banned]
    id_text = encoder.encode(list(id_names), progress=progress)
    cand = encoder.encode(candidates, progress=progress)
    ranked, _ = rank_candidates(candidates, cand, id_text, percentile)
    labels = ranked if m is None else ranked[:m]
    prov = {
        "source": "wordnet head lemmas (noun + adj)", "wordnet": str(folder), "lexicon_size": len(lexicon),
        "excluded_id_names": len(lexicon) - len(candidates), "M": m, "percentile": percentile,
        "encoder": encoder.key, "id_names": len(id_names),
    }  # fmt: skip
    return Vocabulary(labels, "negmined", prov)
