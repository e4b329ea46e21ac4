"""LLM-generated negative vocabularies (paper Sec. 4.4, App. G): per-class near siblings and EOE.

Siblings: one prompt per ID class asks for ``k`` (20) fine-grained near siblings of that class; any
answer equal to an ID class name or one of its WordNet synonyms is dropped (case- and
space-insensitive); the per-class lists are kept (for the k sweep) and the pool is their de-duplicated
concatenation. Repeated generations differ by the request parameter ``seed = generation``, so each one is
cached separately and replays offline.

EOE (Cao et al., ICML 2024): three prompt styles over the whole ID set, ``far`` and ``fine_grained``
(one conversation asking for 50 outlier classes per turn until ``n_classes`` = 500 are reached) and
``near`` (one prompt per ID class for a few neighbours). The prompt texts here follow the structure of
EOE's release (semicolon-separated ID names, answers as ``- name`` lines) in our own words; pass
``prompts=`` to use other wording. Answers are lower-cased, de-duplicated, and ID names removed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from ..llm import ChatClient
from .vocabulary import Vocabulary

__all__ = ["SIBLING_PROMPT", "EOE_PROMPTS", "parse_list", "generate_siblings", "siblings_vocabulary", "generate_eoe"]

SIBLING_PROMPT = (
    "The image classifier knows this class: \"{name}\". List {k} other fine-grained visual categories "
    "that are its nearest siblings: things a person could easily confuse with \"{name}\" in a photo but "
    "that are NOT \"{name}\" and are not among the classifier's other classes. Use short common names. "
    "Answer with one name per line, each line starting with '- ', and nothing else."
)

EOE_PROMPTS = {
    "far": (
        "An image classifier recognises these {n_id} classes: {id_names}. Name {batch} visual categories "
        "that look clearly different from every one of them (far outliers for this classifier). "
        "Answer with one name per line, each line starting with '- ', and nothing else."
    ),
    "fine_grained": (
        "An image classifier recognises these {n_id} fine-grained classes: {id_names}. Name {batch} "
        "fine-grained visual categories of the same kinds that are not in the list but look similar to "
        "some of them. Answer with one name per line, each line starting with '- ', and nothing else."
    ),
    "near": (
        "An image classifier recognises the class \"{name}\" among others. Name {batch} visual categories "
        "that look similar to \"{name}\" but are different things. Answer with one name per line, each "
        "line starting with '- ', and nothing else."
    ),
    "again": "Name {batch} more such categories, different from all the ones you gave, in the same format.",
}

_BULLET = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s*")


def _key(name: str) -> str:
    return " ".join(name.lower().replace("_", " ").split())


def parse_list(text: str) -> list[str]:
    """Names from an answer: a JSON list of strings, or one name per (bulleted / numbered) line."""
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
        name = _BULLET.sub("", line).strip().strip('"').strip()
        if name and not line.strip().endswith(":"):
            out.append(name)
    return out


def generate_siblings(
    client: ChatClient,
    id_names: Sequence[str],
    k: int = 20,
    generation: int = 0,
    synonyms: Sequence[frozenset[str]] | None = None,
    prompt: str = SIBLING_PROMPT,
    progress: bool = True,
    **params,
) -> dict[str, list[str]]:
    """Per ID class, its filtered siblings (answer order, de-duplicated): ``{class name: [labels]}``.

    ``synonyms[i]``: normalised WordNet synonyms of class i (``wordnet.synonyms``); with the ID names
    themselves they are removed from every class's list.
    """
    from tqdm import tqdm

    banned = {_key(n) for n in id_names}
    if synonyms is not None:
        if len(synonyms) != len(id_names):
            raise ValueError(f"{len(synonyms)} synonym sets for {len(id_names)} ID names")
        banned |= {_key(s) for group in synonyms for s in group}
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
    prompts: dict[str, str] | None = None,
    **params,
) -> Vocabulary:
    """EOE's envisioned outlier classes for one prompt style (far, near, fine_grained)."""
    prompts = {**EOE_PROMPTS, **(prompts or {})}
    if style not in ("far", "near", "fine_grained"):
        raise ValueError(f"unknown EOE prompt style {style!r}; known: far, near, fine_grained")
    names: list[str] = []
    if style == "near":
        per_class = max(1, n_classes // max(len(id_names), 1))
        for name in id_names:
            answer = client.complete(prompts["near"].format(name=name, batch=per_class), seed=generation, **params)
            names.extend(parse_list(answer))
    else:
        first = prompts[style].format(n_id=len(id_names), id_names="; ".join(id_names), batch=batch)
        messages = [{"role": "user", "content": first}]
        for turn in range(max(1, -(-n_classes // batch))):
            if turn:
                messages.append({"role": "user", "content": prompts["again"].format(batch=batch)})
            answer = client.complete(messages, seed=generation, **params)
            messages.append({"role": "assistant", "content": answer})
            names.extend(parse_list(answer))
    banned = {_key(n) for n in id_names}
    labels = [s for s in dict.fromkeys(_key(n) for n in names) if s not in banned]
    prov = {"style": style, "n_classes": n_classes, "generation": generation, "llm_model": client.model, "answers": len(names)}
    return Vocabulary(labels, "eoe", prov)
