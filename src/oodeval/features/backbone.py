"""The :class:`Backbone` every model loader returns (``features.backbones``, ``features.module``,
``features.hf``), and the weight files it reads: state dicts loaded safely (safetensors, or
``torch.load(weights_only=True)``, never unpickled code) and linear probe heads.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from .._io import FILE_MARKER_KEY, atomic_path, stamp_text
from ..errors import InputError

log = logging.getLogger(__name__)

__all__ = ["Backbone", "full_precision", "load_state_dict_file", "load_weights_into", "load_head", "save_head"]


def load_state_dict_file(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors of a local weights file, loaded safely.

    ``.safetensors`` through safetensors; anything else through ``torch.load(weights_only=True)``
    (no arbitrary code). A checkpoint dict holding ``state_dict``/``model``/``state_dict_ema`` is
    unwrapped, and a ``module.`` prefix (DataParallel/DDP) is stripped.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file {path} does not exist")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            sd: Any = load_file(str(path), device="cpu")
        except (SafetensorError, OSError) as exc:
            raise InputError(f"{path} is not a readable safetensors file: {exc}") from exc
    else:
        try:
            sd = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # pickle errors come in many types
            raise InputError(f"{path} cannot be loaded safely (torch.load weights_only=True): {exc}") from exc
    for key in ("state_dict_ema", "state_dict", "model"):
        if isinstance(sd, dict) and isinstance(sd.get(key), dict):
            sd = sd[key]
            break
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise InputError(f"{path} does not hold a state dict of tensors")
    if sd and all(k.startswith("module.") for k in sd):
        sd = {k[len("module.") :]: v for k, v in sd.items()}
    return sd


def load_weights_into(model: nn.Module, path: str | Path) -> None:
    """Load a weights file (:func:`load_state_dict_file`) into ``model``; every key and shape must match."""
    sd = load_state_dict_file(path)
    own = model.state_dict()
    wrong = [f"{k} {tuple(v.shape)} (model {tuple(own[k].shape)})" for k, v in sd.items() if k in own and v.shape != own[k].shape]
    if wrong:
        raise InputError(f"weights {path} do not fit the model: {len(wrong)} tensors of another shape (e.g. {wrong[:3]})")
    result = model.load_state_dict(sd, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise InputError(
            f"weights {path} do not fit the model: {len(result.missing_keys)} missing keys "
            f"(e.g. {result.missing_keys[:3]}), {len(result.unexpected_keys)} unexpected keys "
            f"(e.g. {result.unexpected_keys[:3]})"
        )


def save_head(path: str | Path, weight: np.ndarray, bias: np.ndarray, metadata: dict[str, str] | None = None) -> Path:
    """Write a linear head (C, D) and (C,) as safetensors, atomically, oodeval's "linear head" marker
    in its metadata; an existing file is replaced only when it carries that marker."""
    from safetensors.numpy import save_file

    with atomic_path(path, "linear head") as tmp:
        save_file({"weight": np.ascontiguousarray(weight, np.float32), "bias": np.ascontiguousarray(bias, np.float32)}, str(tmp),
                  metadata={**(metadata or {}), FILE_MARKER_KEY: stamp_text("linear head")})
    return Path(path)


def load_head(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """A linear head ``(weight (C, D), bias (C,))`` from a safetensors/torch file with keys weight, bias."""
    sd = load_state_dict_file(path)
    w = sd.get("weight", sd.get("fc.weight"))
    b = sd.get("bias", sd.get("fc.bias"))
    if w is None or b is None or w.ndim != 2 or b.shape != (w.shape[0],):
        raise InputError(f"{path} is not a linear head: need 'weight' (C, D) and 'bias' (C,), found {sorted(sd)}")
    return w.float().numpy(), b.float().numpy()


@dataclass
class Backbone:
    """A loaded model with its preprocessing.

    ``transform`` maps a PIL image (in ``image_mode``) to a tensor; ``preprocessing`` records it;
    ``forward(x)`` returns ``{"features": (B, D), "logits": (B, C) or None}`` in float32.
    """

    model: nn.Module
    kind: str
    name: str
    transform: Callable
    preprocessing: dict
    image_mode: str = "RGB"
    weight: np.ndarray | None = None
    bias: np.ndarray | None = None
    tokenizer: Any = None
    info: dict = field(default_factory=dict)
    _probe: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)

    def to(self, device: torch.device | str) -> Backbone:
        self.model.to(device)
        if self._probe is not None:
            self._probe = (self._probe[0].to(device), self._probe[1].to(device))
        return self

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Pre-logits (timm) or l2-normalised image embeddings (open_clip, hf)."""
        if self.kind in ("open_clip", "hf"):
            return self.model.encode_image(x, normalize=True)
        return self.model.forward_head(self.model.forward_features(x), pre_logits=True)

    def logits_from(self, feats: torch.Tensor) -> torch.Tensor | None:
        """The head applied to features in float32 (autocast off): the probe's if attached, else
        timm's own Linear classifier."""
        with full_precision(feats):
            feats = feats.float()
            if self._probe is not None:
                w, b = self._probe
                return feats @ w.T + b
            if self.kind != "timm":
                return None
            if self.info.get("linear_head"):
                return self.model.get_classifier()(feats)
        if self.info.get("classifier"):
            raise InputError(f"{self.name}: logits from features need a Linear classifier; use forward()")
        return None

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor | None]:
        """Features and logits, float32. Under autocast only the trunk runs in low precision: the
        head (timm's ``forward_head``: pooling, final norm, classifier) runs in float32 on the
        float32 trunk output, so logits are the float32 head applied to the stored features."""
        if self.kind == "timm" and self._probe is None and self.info.get("classifier"):
            feats_map = self.model.forward_features(x)
            with full_precision(feats_map):
                feats_map = feats_map.float()
                feats = self.model.forward_head(feats_map, pre_logits=True)
                if self.info.get("linear_head") and not self.info.get("head_checked"):
                    self._check_linear_head(feats, self.model.forward_head(feats_map))
                if self.info.get("linear_head"):
                    logits = self.model.get_classifier()(feats)
                else:
                    logits = self.model.forward_head(feats_map)
        else:
            feats = self.features(x).float()
            logits = self.logits_from(feats)
        return {"features": feats.float(), "logits": None if logits is None else logits.float()}

    def _check_linear_head(self, feats: torch.Tensor, logits: torch.Tensor) -> None:
        """Once: the stored head must reproduce the model's logits from its pre-logits, else it is dropped."""
        self.info["head_checked"] = True
        again = self.model.get_classifier()(feats)
        if not torch.allclose(again.float(), logits.float(), rtol=1e-3, atol=1e-3 * float(logits.abs().max()) + 1e-5):
            log.warning("%s: logits are not get_classifier()(pre-logits); keeping logits, dropping weight/bias", self.name)
            self.weight = self.bias = None
            self.info["linear_head"] = False

    def attach_head(self, path: str | Path) -> None:
        """Use the linear probe head in ``path`` for logits, weight and bias."""
        w, b = load_head(path)
        dim = self.info.get("feature_dim")
        if dim is not None and w.shape[1] != dim:
            raise InputError(f"head {path} expects {w.shape[1]}-d features but {self.name} gives {dim}-d")
        self.weight, self.bias = w, b
        dev = next(self.model.parameters()).device
        self._probe = (torch.from_numpy(w).to(dev), torch.from_numpy(b).to(dev))
        self.info["head"] = str(path)


def full_precision(t: torch.Tensor):
    """A context that turns autocast off on ``t``'s device (the head runs in float32)."""
    return torch.autocast(device_type=t.device.type, enabled=False)
