"""ImageNet-1k class names and WordNet ids, offline.

Names: OpenAI's curated list (``open_clip.zero_shot_metadata.IMAGENET_CLASSNAMES``). It repeats two
names: "missile" (classes 657 n03773504 and 744 n04008634) and "sunglasses" (836 n04355933 and
837 n04356056). ``class_names()`` keeps the first occurrence of a repeated name and renames every
later one to the first lemma of its own WordNet synset (timm's ImageNet synset lemmas) that is not
yet a class name: 744 -> "projectile", 837 -> "dark glasses". ``class_names(unique=False)`` gives the
curated list unchanged. wnids come from timm's ``ImageNetInfo`` (the standard sorted synset order).
"""

from __future__ import annotations

from functools import lru_cache

from .._extras import optional
from ..errors import InputError

__all__ = ["class_names", "wnids", "synset_lemmas"]


@lru_cache(maxsize=1)
def wnids() -> tuple[str, ...]:
    """The 1000 ImageNet-1k wnids (``n01440764`` ...) in class-index order."""
    info = optional("timm.data").ImageNetInfo()
    return tuple(info.index_to_label_name(i) for i in range(info.num_classes()))


@lru_cache(maxsize=1)
def synset_lemmas() -> tuple[tuple[str, ...], ...]:
    """For each class, the lemmas of its WordNet synset as timm ships them (``tench, Tinca tinca``)."""
    info = optional("timm.data").ImageNetInfo()
    return tuple(
        tuple(s.strip() for s in info.index_to_description(i).split(",") if s.strip())
        for i in range(info.num_classes())
    )


@lru_cache(maxsize=2)
def class_names(unique: bool = True) -> tuple[str, ...]:
    """OpenAI's curated ImageNet-1k names; with ``unique`` the repeated names are disambiguated."""
    names = list(optional("open_clip.zero_shot_metadata").IMAGENET_CLASSNAMES)
    if not unique:
        return tuple(names)
    taken = set(names)
    seen: set[str] = set()
    lemmas = synset_lemmas()
    for i, name in enumerate(names):
        if name in seen:
            options = [lemma for lemma in lemmas[i] if lemma not in taken]
            if not options:
                raise InputError(f"class {i} ({wnids()[i]}) repeats {name!r} and has no unused synset lemma")
            names[i] = options[0]
            taken.add(options[0])
        seen.add(names[i])
    return tuple(names)
