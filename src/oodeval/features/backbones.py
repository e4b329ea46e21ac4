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
import pickle
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from .._extras import optional
from .._io import hash_arrays
from ..errors import InputError
from .backbone import Backbone, full_precision, load_head, load_state_dict_file, load_weights_into, save_head
from .hf import load_hf
from .module import load_factory, module_backbone
from .names import MODEL_PREFIXES, parse_model_name, unknown_prefix_hint
from .openood import load_openood

__all__ = ["Backbone", "full_precision", "load_backbone", "load_open_clip", "load_state_dict_file", "load_head", "save_head", "file_hash",
           "parse_model_name", "text_tower_fingerprint", "MODEL_PREFIXES", "unknown_prefix_hint"]

#: state-dict name prefixes of image-tower parameters (open_clip ``visual.``; transformers
#: ``vision_model.`` / ``visual_projection.``, also under oodeval's ``hf.`` wrapper)
_IMAGE_PREFIXES = ("visual.", "vision_model.", "visual_projection.", "hf.vision_model.", "hf.visual_projection.")


def text_tower_fingerprint(model: nn.Module) -> str:
    """Hash of a VLM's text-side parameters and buffers (everything but the image tower; random init included)."""
    return hash_arrays({name: t.detach().to("cpu", torch.float32).numpy() for name, t in model.state_dict().items()
                        if not name.startswith(_IMAGE_PREFIXES)})


def file_hash(path: str | Path) -> str:
    """blake2b (128 bit) of a file's bytes."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, lambda: hashlib.blake2b(digest_size=16)).hexdigest()


def _timm_head(model: nn.Module) -> tuple[np.ndarray | None, np.ndarray | None, bool]:
    clf = model.get_classifier()
    if isinstance(clf, nn.Linear) and clf.bias is not None:
        return clf.weight.detach().float().cpu().numpy(), clf.bias.detach().float().cpu().numpy(), True
    if isinstance(clf, nn.Conv2d) and clf.kernel_size == (1, 1) and clf.bias is not None:
        w = clf.weight.detach().float().cpu().numpy()
        return w.reshape(w.shape[0], -1), clf.bias.detach().float().cpu().numpy(), False
    return None, None, False


def _load_timm(name: str, weights: str | None, pretrained: bool, model_kwargs: dict) -> Backbone:
    timm = optional("timm")
    if "checkpoint_path" in model_kwargs:
        raise InputError("pass local weights as weights=PATH (loaded safely), not model_kwargs['checkpoint_path']")
    if ":" not in name and not timm.is_model(name):  # timm's own hub prefixes (hf-hub:, local-dir:) are timm's to check
        raise InputError(f"timm has no model {name!r} (see timm.list_models())")
    if ":" not in name and "." in name:
        try:
            timm.models.get_pretrained_cfg(name)
        except RuntimeError:
            arch, _, tag = name.partition(".")
            raise InputError(f"timm model {arch!r} has no pretrained tag {tag!r} (see timm.list_pretrained({arch + '.*'!r}))") from None
    try:
        model = timm.create_model(name, pretrained=pretrained, **model_kwargs)
    except TypeError as exc:  # a keyword the model does not take, or a value of the wrong type
        if not model_kwargs:
            raise
        raise InputError(f"model_kwargs {model_kwargs} do not fit timm model {name!r}: {exc}") from None
    if weights is not None:
        load_weights_into(model, weights)
    model.eval()
    cfg = timm.data.resolve_data_config({}, model=model)
    transform = timm.data.create_transform(**cfg, is_training=False)
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
    open_clip = optional("open_clip")
    kind, arch, tag = parse_model_name(model if model.startswith("open_clip:") else f"open_clip:{model}")
    if isinstance(pretrained, str):
        tag = pretrained
    if ":" not in arch and arch not in open_clip.list_models():  # its hub prefixes (hf-hub:, local-dir:) are open_clip's to check
        raise InputError(f"open_clip has no model {arch!r} (see open_clip.list_models())")
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
        net, transform = load_factory(name, model_kwargs) if kind == "python" else load_openood(name, model_kwargs, pretrained)
        if weights is not None:
            load_weights_into(net, weights)
        bb = module_backbone(net, transform, name=model)
    elif kind == "hf":
        if model_kwargs:
            raise InputError("model_kwargs apply to timm models only")

        net, transform, tokenizer, prep = load_hf(name, weights, pretrained)
        bb = Backbone(net, "hf", model, transform, prep, "RGB", tokenizer=tokenizer,
                      info={"feature_dim": int(net.hf.config.projection_dim), "text_tower": text_tower_fingerprint(net)})
    else:
        bb = _load_timm(name, None if weights is None else str(weights), pretrained, dict(model_kwargs or {}))
    bb.info["weights"] = None if weights is None else str(weights)
    if head is not None:
        bb.attach_head(head)
    return bb
