"""Load a VLM (open_clip, or ``hf:`` transformers) and tokenizer for text encoding (local weights, a hub tag, or random init).

Delegates to ``oodeval.features.backbones.load_open_clip`` (the image side's loader), so the text
tower gets the same architecture options (QuickGELU from an ``@tag``) and, for random init, the same
parameters (seeded with 0 like ``load_backbone``) as the image tower used for extraction.
"""

from __future__ import annotations

from pathlib import Path

from .._extras import optional
from ..errors import InputError

__all__ = ["load_clip"]


def load_clip(model: str, weights: str | None = None, pretrained: str | None = None, seed: int = 0, device: str = "cpu"):
    """``(model, tokenizer, name)`` for ``[open_clip:]<arch>[@<tag>]``, a model-config ``.json`` path, or
    ``hf:<repo or folder>`` (``features.hf.load_hf``; ``pretrained`` any value but None/"none" = from_pretrained).

    weights: a local checkpoint file; pretrained: an open_clip tag to download (needs network), or
    None / "none" for random initialisation under ``torch.manual_seed(seed)`` (the global RNG is
    restored afterwards). ``name`` (the model string) is what the text cache is keyed by.
    """
    open_clip, torch = optional("open_clip"), optional("torch")
    from ..features.backbones import load_open_clip

    name = model
    if model.startswith("hf:"):
        from ..features.hf import load_hf

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            net, _, tokenizer, _ = load_hf(model[3:], weights, pretrained not in (None, "none"))
        return net.to(device).eval(), tokenizer, name
    path = Path(model)
    if path.suffix == ".json":
        if not path.is_file():
            raise FileNotFoundError(f"model config {path} does not exist")
        open_clip.add_model_config(path)
        name = path.stem
    arch = name.removeprefix("open_clip:").partition("@")[0]
    if arch not in open_clip.list_models():
        raise InputError(f"unknown open_clip model {arch!r} (give an open_clip architecture or a model-config .json)")
    tag = None if pretrained in (None, "none") else pretrained
    if weights is not None and tag is not None:
        raise InputError("give either weights (a local file) or pretrained (a hub tag), not both")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net, _, tokenizer = load_open_clip(name, weights, pretrained=tag)
    return net.to(device).eval(), tokenizer, name
