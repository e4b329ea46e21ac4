"""Any PyTorch classifier as a backbone: penultimate features, logits, the linear head, NAC taps.

A user's ``nn.Module`` (a CIFAR ResNet-18 of the OpenOOD kind, a checkpoint of one's own) goes
through the same extraction, store and detectors as a timm model. What is read from it:

- ``logits``   = the module's output ``model(x)`` (a tensor (B, C); a tuple's first element).
- ``features`` = the input of the head (``head``: a module name, default the last ``nn.Linear``
  registered in the model), captured by a forward pre-hook; or, with ``feature_layer``, the output
  of that module (4-d outputs are averaged over their spatial axes, others flattened).
- ``weight``, ``bias`` = the head's parameters when it is an ``nn.Linear`` with a bias and the
  features are its input; detectors that need (W, b) (ReAct, ASH, ViM, ...) then run.
- NAC taps: layers are module names of the model; ``pre_logits`` is the head's input.

On the command line a model ``package.module:factory`` names a function that returns the model,
or ``(model, transform)``; the transform maps a PIL image to a tensor and is required (a CIFAR
network needs its own 32-px normalisation; no ImageNet default is guessed).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .._io import hash_arrays
from ..errors import InputError
from .backbone import Backbone, full_precision
from .names import unknown_prefix_hint

log = logging.getLogger(__name__)

__all__ = ["ModuleBackbone", "module_backbone", "module_fingerprint", "load_factory"]


def _named(model: nn.Module, name: str, what: str) -> nn.Module:
    modules = dict(model.named_modules())
    if name not in modules:
        raise InputError(f"{what} {name!r} is not a module of {type(model).__name__}; it has e.g. {list(modules)[1:8]}")
    return modules[name]


def _last_linear(model: nn.Module) -> str:
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not names:
        raise InputError(f"{type(model).__name__} has no nn.Linear head; name the feature layer with feature_layer=")
    return names[-1]


@dataclass
class ModuleBackbone(Backbone):
    """A :class:`Backbone` over a plain ``nn.Module``: hooks read the features, the output is the logits."""

    head_name: str | None = None
    feature_layer: str | None = None

    def _capture(self) -> tuple[dict, list]:
        box: dict[str, torch.Tensor] = {}
        if self.feature_layer is not None:
            def keep(_m, _inp, out):
                box["features"] = out[0] if isinstance(out, tuple) else out

            return box, [_named(self.model, self.feature_layer, "feature_layer").register_forward_hook(keep)]

        def keep_input(_m, inp):
            box["features"] = inp[0]

        return box, [_named(self.model, self.head_name, "head").register_forward_pre_hook(keep_input)]

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor | None]:
        box, hooks = self._capture()
        try:
            out = self.model(x)
        finally:
            for h in hooks:
                h.remove()
        logits = out[0] if isinstance(out, (tuple, list)) else out
        if "features" not in box:
            raise InputError(f"{self.name}: the feature layer was not reached in the forward pass")
        feats = box["features"]
        feats = feats.mean(dim=(2, 3)) if feats.ndim == 4 else feats.flatten(1)
        if self._probe is not None:
            logits = self.logits_from(feats)
        elif not isinstance(logits, torch.Tensor) or logits.ndim != 2:
            raise InputError(f"{self.name}: the model must return logits (B, C), got {type(logits).__name__}")
        elif self.info.get("linear_head"):
            logits = self._head_logits(feats, logits)
        return {"features": feats.float(), "logits": logits.float()}

    def _head_logits(self, feats: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The Linear head in float32 on the features (whatever the trunk's autocast). Checked once
        against the module's own output (within 2 bf16 ulps of its scale); a module that changes
        its head's output keeps its output as logits, and its weight/bias are dropped."""
        again = self.logits_from(feats)
        if not self.info.get("head_checked"):
            self.info["head_checked"] = True
            if not torch.allclose(again, out.float(), rtol=0, atol=2.0**-7 * float(out.abs().max()) + 1e-6):
                log.warning("%s: its output is not its head applied to the features; keeping the output, dropping weight/bias", self.name)
                self.weight = self.bias = None
                self.info["linear_head"] = False
                return out
        return again

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x)["features"]

    def logits_from(self, feats: torch.Tensor) -> torch.Tensor | None:
        """The probe's or the module's Linear head on ``feats``, in float32 (autocast off)."""
        with full_precision(feats):
            if self._probe is not None:
                w, b = self._probe
                return feats.float() @ w.T + b
            if self.weight is None:
                return None
            return self.model.get_submodule(self.head_name)(feats.float())

    @property
    def classifier(self) -> nn.Module | None:
        """The head module (whose input NAC's ``pre_logits`` is)."""
        return None if self.head_name is None else self.model.get_submodule(self.head_name)


def module_fingerprint(model: nn.Module) -> str:
    """Hash of the module's class and every parameter and buffer (names, dtypes, shapes, bytes)."""
    arrays = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
    arrays["__class__"] = np.frombuffer(f"{type(model).__module__}.{type(model).__qualname__}".encode(), np.uint8)
    return hash_arrays(arrays)


def module_backbone(
    model: nn.Module,
    transform: Callable,
    *,
    head: str | None = None,
    feature_layer: str | None = None,
    image_mode: str = "RGB",
    name: str | None = None,
) -> ModuleBackbone:
    """Wrap ``model`` (put in eval mode) for extraction; see the module docstring for what is read."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a torch.nn.Module, got {type(model).__name__}")
    if not callable(transform):
        raise InputError("a transform (PIL image -> tensor) is required for an nn.Module")
    if image_mode not in ("RGB", "L"):
        raise InputError(f"image_mode must be 'RGB' or 'L', got {image_mode!r}")
    model.eval()
    head_name = head if head is not None else (None if feature_layer is not None else _last_linear(model))
    w = b = None
    if head_name is not None:
        clf = _named(model, head_name, "head")
        if isinstance(clf, nn.Linear) and clf.bias is not None and feature_layer is None:
            w, b = clf.weight.detach().float().cpu().numpy(), clf.bias.detach().float().cpu().numpy()
    if feature_layer is not None:
        _named(model, feature_layer, "feature_layer")
    label = name or f"module:{type(model).__module__}.{type(model).__qualname__}"
    prep = {"library": "torch", "class": f"{type(model).__module__}.{type(model).__qualname__}",
            "head": head_name, "feature_layer": feature_layer, "transform": repr(transform)}
    info = {"linear_head": w is not None, "classifier": head_name is not None,
            "feature_dim": None if w is None else int(w.shape[1])}
    return ModuleBackbone(model, "module", label, transform, prep, image_mode, w, b, info=info,
                          head_name=head_name, feature_layer=feature_layer)


def load_factory(spec: str, model_kwargs: dict | None = None) -> tuple[nn.Module, Callable]:
    """Import ``package.module:factory``, call it with ``model_kwargs`` and return ``(model, transform)``."""
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise InputError(f"model {spec!r} is not of the form package.module:factory")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        where = "is it on PYTHONPATH?" if "." in mod_name else f"is it on PYTHONPATH? If not a module: {unknown_prefix_hint(mod_name)}"
        raise InputError(f"model {spec!r}: cannot import {mod_name!r} ({exc}); {where} (PYTHONPATH=. from its folder; an experiment file beside it puts that folder on the path itself)") from exc
    factory = getattr(mod, attr, None)
    if not callable(factory):
        raise InputError(f"model {spec!r}: {mod_name} has no callable {attr!r}")
    made = factory(**(model_kwargs or {}))
    model, transform = made if isinstance(made, tuple) else (made, getattr(made, "transform", None))
    if not isinstance(model, nn.Module):
        raise InputError(f"model {spec!r}: the factory returned {type(model).__name__}, not an nn.Module")
    if not callable(transform):
        raise InputError(f"model {spec!r}: the factory must return (model, transform); the transform maps a PIL image to a tensor")
    return model, transform
