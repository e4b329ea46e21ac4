"""Backbone adapters: a timm classifier or an open_clip model, its own preprocessing, safe weights.

Model names: ``timm:<name>`` or a plain ``<name>`` is a timm model; ``open_clip:<arch>`` or
``open_clip:<arch>@<pretrained tag>`` an open_clip model (the tag fixes the preprocessing: mean,
std, interpolation, resize mode, QuickGELU); ``hf:<repo id or folder>`` a Hugging Face ``transformers``
image-text model (AIMv2, see ``features.hf``); ``openood:<network>`` an OpenOOD network in its
checkpoint layout (``openood:resnet18_32x32``, see ``features.openood``). Weights come from a local
file (safetensors, or a torch checkpoint read with ``torch.load(weights_only=True)``, never
unpickled code) or, only with ``pretrained=True``, from the hub. Outputs per batch:

- timm: ``features`` = pre-logits ``forward_head(forward_features(x), pre_logits=True)``,
  ``logits`` = the model's own head on them; the head (W, b) is the ``get_classifier()`` Linear.
  A model without a classifier (``num_classes=0``, e.g. DINOv2) gives features only.
- open_clip / hf: ``features`` = l2-normalised image embeddings; no logits and no head.
  ``info["text_tower"]`` is the fingerprint of the text tower's parameters (``text_tower_fingerprint``),
  recorded with extracted features so label embeddings are checked to come from the same model.
- either, with a probe head file (``oodeval probe``): logits = features @ W.T + b.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from ..errors import InputError
from .names import MODEL_PREFIXES, parse_model_name, unknown_prefix_hint

log = logging.getLogger(__name__)

__all__ = ["Backbone", "full_precision", "load_backbone", "load_open_clip", "load_state_dict_file", "load_head", "save_head", "file_hash",
           "parse_model_name", "text_tower_fingerprint", "MODEL_PREFIXES", "unknown_prefix_hint"]

#: state-dict name prefixes of image-tower parameters (open_clip ``visual.``; transformers
#: ``vision_model.`` / ``visual_projection.``, also under oodeval's ``hf.`` wrapper)
_IMAGE_PREFIXES = ("visual.", "vision_model.", "visual_projection.", "hf.vision_model.", "hf.visual_projection.")


def text_tower_fingerprint(model: nn.Module) -> str:
    """Hash of a VLM's text-side parameters and buffers (everything but the image tower; random init included)."""
    from .._io import hash_arrays

    return hash_arrays({name: t.detach().to("cpu", torch.float32).numpy() for name, t in model.state_dict().items()
                        if not name.startswith(_IMAGE_PREFIXES)})


def file_hash(path: str | Path) -> str:
    """blake2b (128 bit) of a file's bytes."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, lambda: hashlib.blake2b(digest_size=16)).hexdigest()


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


def _load_into(model: nn.Module, path: str | Path) -> None:
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

    from .._io import FILE_MARKER_KEY, atomic_path, stamp_text

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


def _timm_head(model: nn.Module) -> tuple[np.ndarray | None, np.ndarray | None, bool]:
    clf = model.get_classifier()
    if isinstance(clf, nn.Linear) and clf.bias is not None:
        return clf.weight.detach().float().cpu().numpy(), clf.bias.detach().float().cpu().numpy(), True
    if isinstance(clf, nn.Conv2d) and clf.kernel_size == (1, 1) and clf.bias is not None:
        w = clf.weight.detach().float().cpu().numpy()
        return w.reshape(w.shape[0], -1), clf.bias.detach().float().cpu().numpy(), False
    return None, None, False


def _load_timm(name: str, weights: str | None, pretrained: bool, model_kwargs: dict) -> Backbone:
    import timm
    from timm.data import create_transform, resolve_data_config

    if "checkpoint_path" in model_kwargs:
        raise InputError("pass local weights as weights=PATH (loaded safely), not model_kwargs['checkpoint_path']")
    if ":" not in name and not timm.is_model(name):  # timm's own hub prefixes (hf-hub:, local-dir:) are timm's to check
        raise InputError(f"timm has no model {name!r} (see timm.list_models())")
    model = timm.create_model(name, pretrained=pretrained, **model_kwargs)
    if weights is not None:
        _load_into(model, weights)
    model.eval()
    cfg = resolve_data_config({}, model=model)
    transform = create_transform(**cfg, is_training=False)
    w, b, linear = _timm_head(model)
    chans = int(cfg["input_size"][0])
    dim = int(w.shape[1]) if w is not None else (getattr(model, "head_hidden_size", None) or getattr(model, "num_features", None))
    clf = model.get_classifier()
    has_classifier = isinstance(clf, nn.Module) and not isinstance(clf, nn.Identity) and getattr(model, "num_classes", 1) != 0
    info = {"linear_head": linear, "classifier": has_classifier, "feature_dim": dim}
    prep = {"library": "timm", "data_config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.items()}, "transform": repr(transform)}
    return Backbone(model, "timm", name, transform, prep, "L" if chans == 1 else "RGB", w, b, info=info)


def load_open_clip(model: str, weights: str | Path | None = None, pretrained: str | bool | None = None) -> tuple[nn.Module, Callable, Callable]:
    """``(model, preprocess, tokenizer)`` of an open_clip model (image and text towers), in eval mode.

    ``model`` is ``<arch>`` or ``<arch>@<tag>`` (``open_clip:`` prefix allowed). The tag (or a
    string ``pretrained``) sets the preprocessing and QuickGELU from open_clip's pretrained config;
    ``weights`` loads a local file (weights_only); ``pretrained=True`` (or a tag string without
    ``weights``) downloads the tag's weights from the hub.
    """
    import open_clip

    kind, arch, tag = parse_model_name(model if model.startswith("open_clip:") else f"open_clip:{model}")
    if isinstance(pretrained, str):
        tag = pretrained
    kwargs: dict[str, Any] = {}
    hub = None
    if tag is not None:
        cfg = open_clip.get_pretrained_cfg(arch, tag)
        if not cfg:
            raise InputError(f"open_clip has no pretrained tag {tag!r} for {arch!r}; see open_clip.list_pretrained()")
        kwargs.update(image_mean=cfg.get("mean"), image_std=cfg.get("std"), image_interpolation=cfg.get("interpolation"),
                      image_resize_mode=cfg.get("resize_mode"), force_quick_gelu=bool(cfg.get("quick_gelu", False)))
        if weights is None and pretrained:
            hub = tag
    elif pretrained and weights is None:
        raise InputError(f"pretrained=True needs a tag: open_clip:{arch}@<tag>")
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    net, _, preprocess = open_clip.create_model_and_transforms(arch, pretrained=hub, **kwargs)
    if weights is not None:
        if not Path(weights).is_file():
            raise FileNotFoundError(f"weights file {weights} does not exist")
        from safetensors import SafetensorError

        try:
            open_clip.load_checkpoint(net, str(weights), strict=True, weights_only=True)
        except (SafetensorError, pickle.UnpicklingError, EOFError, OSError) as exc:
            raise InputError(f"weights file {weights} cannot be read: {type(exc).__name__}: {exc}") from exc
    net.eval()
    return net, preprocess, open_clip.get_tokenizer(arch)


def load_backbone(
    model: str,
    weights: str | Path | None = None,
    *,
    pretrained: bool = False,
    model_kwargs: dict | None = None,
    head: str | Path | None = None,
) -> Backbone:
    """Load ``model`` (see module doc) with its own preprocessing; optionally attach a probe ``head``.

    Parameters not set by weights are initialised under ``torch.manual_seed(0)`` (the global RNG
    is left as it was), so a random-init model is identical across processes and runs.
    """
    kind, name, tag = parse_model_name(model)
    if weights is not None and not Path(weights).is_file():
        raise FileNotFoundError(f"weights file {weights} does not exist")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # random-init parameters (no weights) are the same in every process
        return _load(model, kind, name, tag, weights, pretrained, model_kwargs, head)


def _load(model: str, kind: str, name: str, tag: str | None, weights, pretrained: bool, model_kwargs, head) -> Backbone:
    if kind == "open_clip":
        if model_kwargs:
            raise InputError("model_kwargs apply to timm models only")
        net, preprocess, tokenizer = load_open_clip(model, weights, pretrained=tag if pretrained else None)
        visual = net.visual
        size = getattr(visual, "image_size", None)
        prep = {"library": "open_clip", "arch": name, "tag": tag, "image_size": list(size) if isinstance(size, tuple) else size,
                "preprocess_cfg": {k: (list(v) if isinstance(v, tuple) else v) for k, v in getattr(visual, "preprocess_cfg", {}).items()},
                "transform": repr(preprocess)}
        bb = Backbone(net, "open_clip", model, preprocess, prep, "RGB", tokenizer=tokenizer,
                      info={"feature_dim": int(getattr(visual, "output_dim", 0)) or None})
        bb.info["text_tower"] = text_tower_fingerprint(net)
    elif kind in ("python", "openood"):
        from .module import load_factory, module_backbone
        from .openood import load_openood

        net, transform = load_factory(name, model_kwargs) if kind == "python" else load_openood(name, model_kwargs, pretrained)
        if weights is not None:
            _load_into(net, weights)
        bb = module_backbone(net, transform, name=model)
    elif kind == "hf":
        if model_kwargs:
            raise InputError("model_kwargs apply to timm models only")
        from .hf import load_hf

        net, transform, tokenizer, prep = load_hf(name, weights, pretrained)
        bb = Backbone(net, "hf", model, transform, prep, "RGB", tokenizer=tokenizer,
                      info={"feature_dim": int(net.hf.config.projection_dim), "text_tower": text_tower_fingerprint(net)})
    else:
        bb = _load_timm(name, None if weights is None else str(weights), pretrained, dict(model_kwargs or {}))
    bb.info["weights"] = None if weights is None else str(weights)
    if head is not None:
        bb.attach_head(head)
    return bb
