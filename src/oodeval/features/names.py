"""Model names (``timm:``, ``open_clip:``, ``hf:``, ``openood:``, ``package.module:factory``) parsed without
importing torch, so that the core (scoring FeatureSets) can read the model a FeatureSet records."""

from __future__ import annotations

import difflib
import importlib.util

from ..errors import InputError

__all__ = ["MODEL_PREFIXES", "parse_model_name", "unknown_prefix_hint"]

#: the model-name prefixes oodeval knows (anything else before ':' must be an importable module)
MODEL_PREFIXES = ("timm", "open_clip", "hf", "openood")


def unknown_prefix_hint(head: str) -> str:
    """The sentence naming the known prefixes (and the closest one) for a ``head:`` that is none of them."""
    close = difflib.get_close_matches(head.lower(), MODEL_PREFIXES, n=1, cutoff=0.6)
    guess = f" (did you mean '{close[0]}:'?)" if close else ""
    return (f"unknown model prefix '{head}:'{guess}; known prefixes: {', '.join(p + ':' for p in MODEL_PREFIXES)}, "
            "or package.module:factory for your own model")  # fmt: skip


def _refused_prefix(head: str) -> bool:
    """A ``head`` before ':' that cannot name a module (not a dotted identifier), or one word close to a known
    prefix that does not import (``openclip``, ``tim``); a real module of that name is taken as the user's."""
    if not all(part.isidentifier() for part in head.split(".")):
        return True
    if "." in head or not difflib.get_close_matches(head.lower(), MODEL_PREFIXES, n=1, cutoff=0.6):
        return False
    return importlib.util.find_spec(head) is None


def parse_model_name(model: str) -> tuple[str, str, str | None]:
    """``(kind, name, tag)`` for ``timm:<name>``, ``<name>``, ``open_clip:<arch>[@<tag>]``, ``hf:<repo or folder>``
    (a transformers VLM, :mod:`oodeval.features.hf`), ``openood:<network>`` (OpenOOD's own network and checkpoint
    layout, :mod:`oodeval.features.openood`), and ``package.module:factory`` (kind ``python``: user
    code returning an ``nn.Module``, see :mod:`oodeval.features.module`). A misspelt prefix (``openclip:``,
    ``open-clip:``) is an :class:`~oodeval.errors.InputError` naming the known ones (:data:`MODEL_PREFIXES`)."""
    if model.startswith("hf:"):
        if not model[3:]:
            raise InputError(f"model {model!r}: no Hugging Face repo id or folder after 'hf:'")
        return "hf", model[3:], None
    if model.startswith("open_clip:"):
        arch = model[len("open_clip:") :]
        arch, _, tag = arch.partition("@")
        if not arch:
            raise InputError(f"model {model!r}: no open_clip architecture after 'open_clip:'")
        return "open_clip", arch, tag or None
    if model.startswith("openood:"):
        if not model[len("openood:") :]:
            raise InputError(f"model {model!r}: no OpenOOD network after 'openood:' (e.g. openood:resnet18_32x32)")
        return "openood", model[len("openood:") :], None
    if model.startswith("timm:"):
        model = model[len("timm:") :]
    elif ":" in model:
        head = model.partition(":")[0]
        if _refused_prefix(head):
            raise InputError(f"model {model!r}: {unknown_prefix_hint(head)}")
        return "python", model, None
    if not model:
        raise InputError("empty model name")
    return "timm", model, None
