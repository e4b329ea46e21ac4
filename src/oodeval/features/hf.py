"""Hugging Face ``transformers`` dual-encoder VLMs (AIMv2-L LiT, paper Tab. A8) behind open_clip's interface.

``hf:<repo id or local folder>`` names the model. ``load_hf(name, weights, pretrained)`` gives
``(HFCLIP, transform, tokenizer, preprocessing)``:

- ``HFCLIP.encode_image(x, normalize)`` = ``get_image_features`` (pooled, projected);
  ``encode_text(ids, normalize)`` = ``get_text_features`` with the padding mask, as open_clip's.
- the transform is the model's own image processor (resize shortest edge, centre crop, its mean/std,
  its resampling filter) rebuilt in torchvision so the DataLoader path matches timm/open_clip;
- the tokenizer pads/truncates to the text tower's context length and returns ``input_ids``.

Weights: ``pretrained=True`` loads ``from_pretrained(name)`` (a local folder, or the hub where
reachable); otherwise the architecture comes from the config and parameters are random (seeded by
the caller) or read from a local ``weights`` file (safetensors / weights_only checkpoint).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .._extras import optional
from ..errors import InputError
from .backbone import load_weights_into

__all__ = ["HFCLIP", "HFTokenizer", "load_hf"]


class HFCLIP(nn.Module):
    """A ``transformers`` model with ``get_image_features`` / ``get_text_features`` as an open_clip-style model."""

    def __init__(self, hf: nn.Module, pad_id: int) -> None:
        super().__init__()
        self.hf = hf
        self.pad_id = int(pad_id)

    @staticmethod
    def _pooled(out) -> torch.Tensor:
        return out if isinstance(out, torch.Tensor) else out.pooler_output

    def encode_image(self, x: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        emb = self._pooled(self.hf.get_image_features(pixel_values=x))
        return F.normalize(emb, dim=-1) if normalize else emb

    def encode_text(self, ids: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        emb = self._pooled(self.hf.get_text_features(input_ids=ids, attention_mask=(ids != self.pad_id).long()))
        return F.normalize(emb, dim=-1) if normalize else emb


class HFTokenizer:
    """``tokenizer(texts) -> LongTensor (N, context)``: the model's tokenizer, padded to its context length."""

    def __init__(self, tokenizer, context_length: int) -> None:
        self.tokenizer = tokenizer
        self.context_length = int(context_length)

    def __call__(self, texts: list[str]) -> torch.Tensor:
        return self.tokenizer(list(texts), padding="max_length", max_length=self.context_length, truncation=True,
                              return_tensors="pt")["input_ids"]


def _transform(processor) -> tuple[Callable, dict]:
    T = optional("torchvision.transforms")
    size = processor.size
    short = size.get("shortest_edge") or min(size.get("height", 0), size.get("width", 0))
    crop = processor.crop_size if getattr(processor, "do_center_crop", False) else None
    crop_hw = (crop["height"], crop["width"]) if crop else (short, short)
    interp = T.InterpolationMode(getattr(processor.resample, "name", "BICUBIC").lower())
    if not short:
        raise InputError(f"image processor {type(processor).__name__} gives no resize size ({size})")
    steps = [T.Resize(short, interpolation=interp), T.CenterCrop(crop_hw), T.ToTensor(),
             T.Normalize(mean=list(processor.image_mean), std=list(processor.image_std))]
    prep = {"library": "transformers", "resize_shortest_edge": short, "center_crop": list(crop_hw),
            "interpolation": interp.value, "mean": list(processor.image_mean), "std": list(processor.image_std)}
    return T.Compose(steps), prep


def load_hf(name: str, weights: str | Path | None = None, pretrained: bool = False) -> tuple[HFCLIP, Callable, HFTokenizer, dict]:
    """``(model in eval mode, image transform, tokenizer, preprocessing record)`` for a transformers VLM."""
    transformers = optional("transformers")
    if pretrained and weights is not None:
        raise InputError("give either weights (a local file) or pretrained (from_pretrained), not both")
    if pretrained:
        net = transformers.AutoModel.from_pretrained(name)
    else:
        net = transformers.AutoModel.from_config(transformers.AutoConfig.from_pretrained(name))
        if weights is not None:
            load_weights_into(net, weights)
    if not (hasattr(net, "get_image_features") and hasattr(net, "get_text_features")):
        raise InputError(f"hf:{name} is a {type(net).__name__}, not an image-text dual encoder "
                         "(needs get_image_features and get_text_features)")
    tokenizer = transformers.AutoTokenizer.from_pretrained(name)
    if tokenizer.pad_token_id is None:
        raise InputError(f"hf:{name}: the tokenizer has no padding token")
    transform, prep = _transform(transformers.AutoImageProcessor.from_pretrained(name))
    context = net.config.text_config.max_position_embeddings
    model = HFCLIP(net, tokenizer.pad_token_id).eval()
    return model, transform, HFTokenizer(tokenizer, context), {**prep, "name": name, "class": type(net).__name__}
