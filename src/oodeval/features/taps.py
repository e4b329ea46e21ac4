"""Per-layer taps captured during the one extraction pass: NAC's neuron states.

NAC (Liu et al., "Neuron activation coverage: rethinking OOD detection and generalization",
ICLR 2024) scores a sample by how well its neuron states are covered by ID training. A layer's
state for neuron j is sigmoid(alpha * o_j * dKL(u || p)/do_j), o the layer output and u the
uniform distribution over classes (KL(u || p) equals the cross-entropy to u up to a constant,
which the release differentiates). What we store per layer, as FeatureSet extra
``nac/<layer>`` (N, C_layer) float32, is the RAW product before the sigmoid:

    state_j = pool(o)_j * pool(dL/do)_j,   L = -(1/C) sum_c log softmax(f)_c

with pool = the SUM over spatial positions (or tokens) of each channel, taken separately for o
and for the gradient, exactly as the release (``avg_pooling`` sums; "the denominator can be
scaled by sigmoid"). The sigmoid steepness alpha stays a detector hyperparameter.

Layers are module names of the model, plus the reserved name ``pre_logits``: the input of the
classifier (``model.get_classifier()``), i.e. the pooled penultimate feature - for a ResNet the
release's ``avgpool`` layer. :func:`default_nac_layers` gives the release's ImageNet choice for
ResNets (avgpool, layer3, layer2, layer1) and ViTs (final norm, ``ln_2`` of the last three
blocks), and the ResNet rule for other timm nets.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..errors import InputError

__all__ = ["PRE_LOGITS", "NacPass", "default_nac_layers", "vit_depth", "forward_with_nac", "nac_states", "pool_state"]

#: reserved layer name: the classifier's input (pooled penultimate feature)
PRE_LOGITS = "pre_logits"


def default_nac_layers(model: nn.Module) -> list[str]:
    """NAC layers for a timm model, deepest first (the NAC release's choice where it has one).

    * ViT / DeiT (timm ``VisionTransformer``): the release's ViT-B/16 layers, the final
      LayerNorm (torchvision ``encoder.ln`` = timm ``norm``, or ``fc_norm`` for average-pooled
      models) and ``ln_2`` of the last three blocks (timm ``blocks.{L-1,L-2,L-3}.norm2``).
    * every other model: ``pre_logits`` plus the outputs of the three feature stages before the
      last one, from timm's ``feature_info`` (module names). For ResNets this is the release's
      ImageNet choice ``avgpool, layer3, layer2, layer1`` (``pre_logits`` = avgpool's output).
      Models without ``feature_info`` get ``["pre_logits"]``.
    """
    depth = vit_depth(model)
    if depth is not None:
        final = "norm" if not isinstance(model.norm, nn.Identity) else "fc_norm"
        return [final] + [f"blocks.{i}.norm2" for i in range(depth - 1, max(depth - 4, -1), -1)]
    modules = [e["module"] for e in _feature_info(model)]
    return [PRE_LOGITS] + modules[-2:-5:-1]


def vit_depth(model: nn.Module) -> int | None:
    """Number of transformer blocks of a timm ``VisionTransformer`` (DeiT included), else None."""
    from timm.models.vision_transformer import VisionTransformer

    return len(model.blocks) if isinstance(model, VisionTransformer) else None


def _feature_info(model: nn.Module) -> list[dict]:
    """timm's ``feature_info`` entries (dicts with ``module``, ``num_chs``, ...); [] without it."""
    info = getattr(model, "feature_info", None)
    if info is None:
        return []
    return info.get_dicts() if hasattr(info, "get_dicts") else list(info)


def pool_state(t: Tensor, channels: int | None = None) -> Tensor:
    """Sum over all axes except batch and channel: (B,C,H,W)->(B,C) (NCHW; NHWC when
    ``channels`` matches the last axis only), (B,T,C)->(B,C) over tokens, (B,C) unchanged."""
    if t.ndim == 2:
        return t
    if t.ndim == 3:
        return t.sum(dim=1)
    if t.ndim == 4:
        if channels is not None and t.shape[1] != channels and t.shape[-1] == channels:
            return t.sum(dim=(1, 2))
        return t.flatten(2).sum(dim=2)
    raise InputError(f"cannot pool a layer output of shape {tuple(t.shape)}")


@dataclass
class NacPass:
    """One batch: logits (B, C), pre-logit features (B, D), NAC states name -> (B, C_layer)."""

    logits: Tensor
    features: Tensor
    states: dict[str, Tensor]


def forward_with_nac(model: nn.Module, images: Tensor, layers: list[str], classifier: nn.Module | None = None) -> NacPass:
    """Run ``model`` once on ``images`` and return logits, pre-logit features and NAC states.

    The model must be in eval mode (BatchNorm statistics fixed, so each sample's gradient is its
    own). Parameters get no gradients; all returned tensors are detached, float32; the returned
    logits are ``classifier`` applied in float32 to the returned features (the gradient flows
    through the model's own, possibly autocast, logits). ``classifier``: the head whose input is
    ``pre_logits`` (default: timm's ``model.get_classifier()``).
    """
    if model.training:
        raise InputError("forward_with_nac needs model.eval(): train-mode BatchNorm mixes samples")
    if not layers:
        raise InputError("forward_with_nac needs at least one layer name")
    modules = dict(model.named_modules())
    if classifier is None and hasattr(model, "get_classifier"):
        classifier = model.get_classifier()
    if not isinstance(classifier, nn.Module):
        raise InputError(f"{type(model).__name__} has no get_classifier() module, so pre_logits is undefined")
    unknown = [n for n in layers if n != PRE_LOGITS and n not in modules]
    if unknown:
        raise InputError(f"unknown layer names {unknown}; the model has e.g. {list(modules)[1:8]}")
    captured: dict[str, Tensor] = {}
    hooks = []

    def keep_output(name: str):
        def hook(_m, _inp, out):
            captured[name] = out[0] if isinstance(out, tuple) else out

        return hook

    def keep_input(_m, inp):
        captured[PRE_LOGITS] = inp[0]

    hooks.append(classifier.register_forward_pre_hook(keep_input))
    for name in layers:
        if name != PRE_LOGITS:
            hooks.append(modules[name].register_forward_hook(keep_output(name)))
    try:
        with torch.enable_grad():
            x = images.detach()
            logits = model(x)
            missing = [n for n in [*layers, PRE_LOGITS] if n not in captured]
            if missing:
                raise InputError(f"layers {missing} were not reached in the forward pass")
            loss = -torch.log_softmax(logits.float(), dim=-1).mean(dim=-1).sum()
            grads = torch.autograd.grad(loss, [captured[n] for n in layers])
    finally:
        for h in hooks:
            h.remove()
    channels = {e["module"]: int(e["num_chs"]) for e in _feature_info(model)}
    states = {}
    for name, g in zip(layers, grads):
        o = captured[name].detach()
        states[name] = (pool_state(o, channels.get(name)) * pool_state(g, channels.get(name))).float()
    features = captured[PRE_LOGITS].detach().float()
    with torch.no_grad(), torch.autocast(device_type=features.device.type, enabled=False):
        logits32 = classifier(features)  # the float32 head on the stored features, whatever the trunk's autocast
    return NacPass(logits32.float(), features, states)


def nac_states(model: nn.Module, images: Tensor, layers: list[str]) -> tuple[Tensor, dict[str, Tensor]]:
    """Logits (B, C) and NAC states {layer: (B, C_layer)} for one batch; see module docstring.

    Store each state as FeatureSet extra ``f"nac/{layer}"`` (the ``nac`` detector reads
    ``extra:nac/*``).
    """
    out = forward_with_nac(model, images, layers)
    return out.logits, out.states
