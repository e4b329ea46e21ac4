"""Model names (``timm:``, ``open_clip:``, ``hf:``, ``package.module:factory``) parsed without
importing torch, so that the core (scoring FeatureSets) can read the model a FeatureSet records."""

from __future__ import annotations

__all__ = ["parse_model_name"]


def parse_model_name(model: str) -> tuple[str, str, str | None]:
    """``(kind, name, tag)`` for ``timm:<name>``, ``<name>``, ``open_clip:<arch>[@<tag>]``, ``hf:<repo or folder>``
    (a transformers VLM, :mod:`oodeval.features.hf`), and ``package.module:factory`` (kind ``python``: user
    code returning an ``nn.Module``, see :mod:`oodeval.features.module`)."""
    if model.startswith("hf:"):
        if not model[3:]:
            raise ValueError(f"model {model!r}: no Hugging Face repo id or folder after 'hf:'")
        return "hf", model[3:], None
    if model.startswith("open_clip:"):
        arch = model[len("open_clip:") :]
        arch, _, tag = arch.partition("@")
        if not arch:
            raise ValueError(f"model {model!r}: no open_clip architecture after 'open_clip:'")
        return "open_clip", arch, tag or None
    if model.startswith("timm:"):
        model = model[len("timm:") :]
    elif ":" in model:
        return "python", model, None
    if not model:
        raise ValueError("empty model name")
    return "timm", model, None
