"""Prompt templates for encoding labels (paper App. G).

``PAPER`` is the paper's 8-template ensemble: the bare name and seven of OpenAI's 80 ImageNet
templates (Radford et al. 2021), averaged over for every label, ID or negative (the paper's App. F).
NegLabel's release does not ensemble: it encodes every ID name and every WordNet noun with one
prompt, ``"the nice {}"`` (``custom_config/clip.py``: ``prompt_idx_pos = prompt_idx_neg = 85`` into
its ``prompt_templates`` list), and every adjective with ``"This is a {} photo"``. ``OPENAI`` is
OpenAI's full list as shipped by open_clip. A template set is identified by its name and the hash of its strings, which
is part of every text-embedding cache key.
"""

from __future__ import annotations

from .._extras import optional
from .._io import hash_json
from ..errors import InputError

__all__ = ["PAPER", "template_set", "templates_id"]

PAPER: tuple[str, ...] = (
    "{}",
    "a photo of a {}.",
    "a bad photo of a {}.",
    "a photo of many {}.",
    "a photo of the large {}.",
    "a photo of the small {}.",
    "a cropped photo of a {}.",
    "a close-up photo of a {}.",
)


def template_set(name: str = "paper") -> tuple[str, ...]:
    """The named template set: ``paper`` (8, App. G), ``openai`` (80, open_clip) or ``name`` (bare label)."""
    if name == "paper":
        return PAPER
    if name == "name":
        return ("{}",)
    if name == "openai":
        return tuple(t("{}") for t in optional("open_clip.zero_shot_metadata").OPENAI_IMAGENET_TEMPLATES)
    raise InputError(f"unknown template set {name!r}; known: paper, openai, name")


def templates_id(templates: tuple[str, ...] | list[str]) -> str:
    """Stable identifier of a template list (order matters: it fixes the averaging order)."""
    if not templates or any("{}" not in t for t in templates):
        raise InputError(f"every template must contain '{{}}'; got {list(templates)!r}")
    return hash_json(list(templates))
