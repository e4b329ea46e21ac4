"""LLM-generated negative vocabularies (paper Sec. 4.4, App. G): per-class near siblings and EOE.

Siblings: one prompt per ID class asks for ``k`` (20) fine-grained near siblings of that class; any
answer equal to an ID class name or one of its WordNet synonyms is dropped (case- and
space-insensitive); the per-class lists are kept (for the k sweep) and the pool is their de-duplicated
concatenation. Repeated generations differ by the request parameter ``seed = generation``, so each one is
cached separately and replays offline.

EOE (Cao et al., ICML 2024, released code): three prompt styles. ``far`` and ``fine_grained``: one
conversation over the whole ID set asking for ``batch`` = 50 outlier classes per turn until
``n_classes`` = 500 are asked for; ``near``: one prompt per ID class for ``per_class`` = 3 neighbours,
then the release's word-overlap filter (a label sharing any whitespace-separated word with an ID
name is dropped; the release compares the lower-cased LLM labels with the ID names as given, and so
does this). Answers are lower-cased, de-duplicated, and ID names removed (case-insensitive), as released.

Prompt wording comes from a prompt file (``zeroshot.prompts``; ours by default, EOE's released prompts
when the user supplies them). Answers are read as lists only (``parse_list``): prose lines never
become labels.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from ..errors import InputError
from ..llm import ChatClient
from .prompts import load_prompts, prompts_provenance
from .vocabulary import Vocabulary

__all__ = ["parse_list", "overlap_filter", "generate_siblings", "siblings_vocabulary", "generate_eoe"]

_BULLET = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+")


def _key(name: str) -> str:
    return " ".join(name.lower().replace("_", " ").split())


def parse_list(text: str) -> list[str]:
    """Names from an answer: a JSON list of strings, or the list-item lines (``- x``, ``* x``, ``1. x``,
    ``1) x``). Any other line (preamble, prose, an item ending in ':' as a heading) is not a name."""
    text = text.strip()
    if text.startswith("```"):
        text = text.strip("`").split("\n", 1)[-1]
    try:
        data = json.loads(text)
        if isinstance(data, list):
            return [str(x).strip() for x in data if str(x).strip()]
    except json.JSONDecodeError:
        pass
    out = []
    for line in text.splitlines():
        match = _BULLET.match(line)
        if not match:
            continue
        name = line[match.end() :].strip().strip('"').strip()
        if name and not name.endswith(":"):
            out.append(name)
    return out


def overlap_filter(labels: Sequence[str], id_names: Sequence[str]) -> list[str]:
    """EOE's near-style filter: drop every label that shares a whitespace-separated word with an ID name."""
    words = {w for name in id_names for w in name.split()}
    return [label for label in labels if not any(w in words for w in label.split())]


def generate_siblings(
    client: ChatClient,
    id_names: Sequence[str],
    k: int = 20,
    generation: int = 0,
    synonyms: Sequence[frozenset[str]] | None = None,
    prompts: str | Path | None = None,
    progress: bool = True,
    **params,
) -> dict[str, list[str]]:
    """Per ID class, its filtered siblings (answer order, de-duplicated): ``{class name: [labels]}``.

    ``synonyms[i]``: normalised WordNet synonyms of class i (``wordnet.synonyms``); with the ID names
    themselves they are removed from every class's list. ``prompts``: a prompt file (default: ours).
    """
    from tqdm import tqdm

    banned = {_key(n) for n in id_names}
    if synonyms is not None:
        if len(synonyms) != len(id_names):
            raise InputError(f"{len(synonyms)} synonym sets for {len(id_names)} ID names")
        banned |= {_key(s) for group in synonyms for s in group}
    prompt = load_prompts(prompts, needed=("siblings",))["siblings"]
    out: dict[str, list[str]] = {}
    for name in tqdm(id_names, desc=f"siblings gen {generation}", unit="class", disable=not progress):
        answer = client.complete(prompt.format(name=name, k=k), seed=generation, **params)
        kept = [s for s in parse_list(answer) if _key(s) not in banned]
        out[name] = list(dict.fromkeys(_key(s) for s in kept))
    return out


def siblings_vocabulary(per_class: dict[str, list[str]], k: int | None = None, seed: int | None = None, provenance: dict | None = None) -> Vocabulary:
    """Pool of the per-class siblings: the first ``k`` per class (all when None), de-duplicated.

    With ``seed`` each class's list is first shuffled (numpy default_rng(seed)), so k sets only the
    size, not the LLM's answer order (paper Fig. A1/A3).
    """
    import numpy as np

    rng = np.random.default_rng(seed) if seed is not None else None
    labels: list[str] = []
    for name in per_class:
        items = list(per_class[name])
        if rng is not None:
            items = [items[i] for i in rng.permutation(len(items))]
        labels.extend(items if k is None else items[:k])
    labels = list(dict.fromkeys(labels))
    prov = {"classes": len(per_class), "k": k, "seed": seed, "per_class": per_class, **(provenance or {})}
    return Vocabulary(labels, "llm-siblings", prov)


def generate_eoe(
    client: ChatClient,
    id_names: Sequence[str],
    style: str = "fine_grained",
    n_classes: int = 500,
    generation: int = 0,
    batch: int = 50,
    per_class: int = 3,
    prompts: str | Path | None = None,
    **params,
) -> Vocabulary:
    """EOE's envisioned outlier classes for one prompt style (far, near, fine_grained), as released."""
    if style not in ("far", "near", "fine_grained"):
        raise InputError(f"unknown EOE prompt style {style!r}; known: far, near, fine_grained")
    keys = ("eoe.near.first",) if style == "near" else (f"eoe.{style}.first", f"eoe.{style}.again")
    texts = load_prompts(prompts, needed=keys)
    names: list[str] = []
    if style == "near":
        for name in id_names:
            answer = client.complete(texts["eoe.near.first"].format(name=name, batch=per_class), seed=generation, **params)
            names.extend(parse_list(answer))
    else:
        fields = {"n_id": len(id_names), "id_names": "; ".join(id_names), "batch": batch}
        messages = [{"role": "user", "content": texts[keys[0]].format(**fields)}]
        for turn in range(max(1, -(-n_classes // batch))):
            if turn:
                messages.append({"role": "user", "content": texts[keys[1]].format(**fields)})
            answer = client.complete(messages, seed=generation, **params)
            messages.append({"role": "assistant", "content": answer})
            names.extend(parse_list(answer))
    lowered = list(dict.fromkeys(n.lower() for n in names))
    banned = {n.lower() for n in id_names}
    labels = [s for s in lowered if s not in banned]
    if style == "near":
        labels = overlap_filter(labels, id_names)
    prov = {"style": style, "n_classes": n_classes, "batch": batch, "per_class": per_class, "generation": generation,
            "llm_model": client.model, "answers": len(names), **prompts_provenance(prompts, keys)}
    return Vocabulary(labels, "eoe", prov)
