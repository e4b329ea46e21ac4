"""Read WordNet 3.0 from WNDB files (Debian ``wordnet-base``: /usr/share/wordnet) with no NLTK.

``head_lemmas()`` is NegLabel's lexicon: the first ("head") lemma of every noun and adjective synset
in ``data.noun`` and ``data.adj``, underscores turned into spaces, the adjective syntactic markers
``(a)``, ``(p)``, ``(ip)`` removed, lower-cased and de-duplicated (first occurrence kept, nouns before
adjectives, file order). From the Debian files this gives 67,186 noun + 14,006 adjective distinct
heads, 79,403 after merging the two: the paper's count. (Without lower-casing it is 80,184; keeping
the markers gives 79,628.)
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..errors import InputError

__all__ = ["DEFAULT_WORDNET", "Synset", "NounSense", "synsets", "head_lemmas", "synonyms", "normalise", "noun_senses", "noun_sense"]

DEFAULT_WORDNET = Path("/usr/share/wordnet")
_MARKER = re.compile(r"\((a|p|ip)\)$")
_POS_FILES = {"noun": "data.noun", "adj": "data.adj", "verb": "data.verb", "adv": "data.adv"}


def normalise(lemma: str) -> str:
    """WordNet lemma -> label: underscores to spaces, adjective marker dropped, lower case, single spaces."""
    return " ".join(_MARKER.sub("", lemma).replace("_", " ").lower().split())


class Synset(tuple):
    """(pos, offset, lemmas, lexfile): one line of a WNDB ``data.*`` file (lexfile: the lexicographer
    file number, e.g. 0 adj.all, 44 adj.ppl, 3-28 the noun files)."""

    @property
    def pos(self) -> str:
        return self[0]

    @property
    def offset(self) -> int:
        return self[1]

    @property
    def lemmas(self) -> tuple[str, ...]:
        return self[2]

    @property
    def lexfile(self) -> int:
        return self[3]


def synsets(pos: str, folder: str | Path = DEFAULT_WORDNET) -> Iterator[Synset]:
    """Synsets of ``pos`` (noun, adj, verb, adv) in file order, lemmas as written in the file."""
    if pos not in _POS_FILES:
        raise InputError(f"unknown part of speech {pos!r}; known: {', '.join(_POS_FILES)}")
    path = Path(folder) / _POS_FILES[pos]
    if not path.is_file():
        raise FileNotFoundError(f"WordNet data file {path} not found (install Debian's wordnet-base or pass a WNDB folder)")
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if line.startswith("  "):  # licence header
                continue
            fields = line.split(" ")
            count = int(fields[3], 16)
            lemmas = tuple(fields[4 + 2 * i] for i in range(count))
            yield Synset((pos, int(fields[0]), lemmas, int(fields[1])))


@lru_cache(maxsize=8)
def _heads(folder: str, pos: str) -> tuple[str, ...]:
    """Normalised head lemma of every synset of one part of speech, in file order (repeats kept)."""
    return tuple(normalise(syn.lemmas[0]) for syn in synsets(pos, folder))


def head_lemmas(folder: str | Path = DEFAULT_WORDNET, pos: tuple[str, ...] = ("noun", "adj")) -> list[str]:
    """NegLabel's WordNet lexicon (see module doc): 79,403 labels for WordNet 3.0 nouns + adjectives."""
    return list(dict.fromkeys(h for p in pos for h in _heads(str(Path(folder)), p)))


@lru_cache(maxsize=4)
def _lemma_index(folder: str) -> tuple[dict[str, frozenset[str]], dict[int, frozenset[str]]]:
    by_lemma: dict[str, set[str]] = {}
    by_offset: dict[int, frozenset[str]] = {}
    for syn in synsets("noun", folder):
        group = frozenset(normalise(lemma) for lemma in syn.lemmas)
        by_offset[syn.offset] = group
        for lemma in group:
            by_lemma.setdefault(lemma, set()).update(group)
    return {k: frozenset(v) for k, v in by_lemma.items()}, by_offset


def synonyms(name: str, wnid: str | None = None, folder: str | Path = DEFAULT_WORDNET) -> frozenset[str]:
    """Normalised WordNet synonyms of a class name, the name included.

    With a wnid (``n01440764``) these are the lemmas of that noun synset; without one, the lemmas of
    every noun synset that contains the name.
    """
    by_lemma, by_offset = _lemma_index(str(Path(folder)))
    out = {normalise(name)}
    if wnid is not None:
        if not (wnid.startswith("n") and wnid[1:].isdigit()):
            raise InputError(f"not a noun wnid: {wnid!r}")
        out |= by_offset.get(int(wnid[1:]), frozenset())
    else:
        out |= by_lemma.get(normalise(name), frozenset())
    return frozenset(out)


@dataclass(frozen=True)
class NounSense:
    """One WordNet noun synset: ``wnid`` (``n`` + 8-digit offset), normalised lemmas, gloss."""

    wnid: str
    lemmas: tuple[str, ...]
    gloss: str


@lru_cache(maxsize=4)
def _noun_offsets(folder: str) -> dict[str, tuple[int, ...]]:
    """``index.noun``: lemma (lower case, ``_`` for spaces) -> synset offsets in WordNet's sense order."""
    out: dict[str, tuple[int, ...]] = {}
    path = Path(folder) / "index.noun"
    if not path.is_file():
        raise FileNotFoundError(f"WordNet index {path} not found (install Debian's wordnet-base or pass a WNDB folder)")
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if line.startswith("  "):
                continue
            f = line.split()
            n_synsets, n_pointers = int(f[2]), int(f[3])
            start = 6 + n_pointers  # lemma pos synset_cnt p_cnt [ptr...] sense_cnt tagsense_cnt offsets...
            out[f[0]] = tuple(int(x) for x in f[start : start + n_synsets])
    return out


@lru_cache(maxsize=4096)
def _noun_line(folder: str, offset: int) -> str:
    with open(Path(folder) / "data.noun", "rb") as fh:  # WNDB offsets are byte offsets into data.noun
        fh.seek(offset)
        return fh.readline().decode("utf-8", errors="replace")


def noun_sense(wnid: str, folder: str | Path = DEFAULT_WORDNET) -> NounSense | None:
    """The noun synset ``wnid`` (``n02451415``), or None when WordNet has no such synset."""
    if not (len(wnid) == 9 and wnid.startswith("n") and wnid[1:].isascii() and wnid[1:].isdigit()):
        return None
    offset = int(wnid[1:])
    try:
        line = _noun_line(str(Path(folder)), offset)
    except (OSError, ValueError):
        return None
    fields = line.split(" ")
    if len(fields) < 5 or not fields[0].isdigit() or int(fields[0]) != offset or fields[2] != "n":
        return None
    count = int(fields[3], 16)
    lemmas = tuple(dict.fromkeys(normalise(fields[4 + 2 * i]) for i in range(count)))
    gloss = line.partition(" | ")[2].strip()
    return NounSense(wnid, lemmas, gloss)


def noun_senses(label: str, folder: str | Path = DEFAULT_WORDNET) -> list[NounSense]:
    """The noun senses of ``label`` in WordNet's order (most frequent first); [] when it is no noun lemma.

    The label is looked up as written (lower case, spaces as ``_``) and with ``-`` read as a space.
    """
    index = _noun_offsets(str(Path(folder)))
    keys = dict.fromkeys("_".join(v.lower().split()) for v in (label, label.replace("-", " ")))
    offsets = dict.fromkeys(o for k in keys for o in index.get(k, ()))
    senses = (noun_sense(f"n{o:08d}", folder) for o in offsets)
    return [s for s in senses if s is not None]
