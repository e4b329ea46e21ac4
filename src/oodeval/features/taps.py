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
ResNets (avgpool, layer3, layer2, layer1) and ViT-like models (final norm, ``ln_2`` of the last
three blocks), and the ResNet rule for other timm nets.

The final norm of a ViT-like model is read where the classifier reads it (:func:`final_norm_readout`),
as the release reads ``encoder.ln`` at the CLS token only ("it will be used for classification"): the
CLS token for token-pooled models (ViT, DeiT, DINOv2, XCiT), and for average-pooled ones without a CLS
readout (timm's DINOv3, ``global_pool="avg"``) the mean of the patch tokens (prefix tokens excluded)
for the output and the sum of their gradients, i.e. the pooled feature times the gradient on it. A
final norm that runs after pooling (``fc_norm``: EVA02) has one vector per image and is read as is.
Every other token layer (the blocks' ``norm2``) is summed over all tokens, as the release's
``pooling_vit_mlp`` does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .._extras import optional
from ..errors import InputError
from .names import parse_model_name

__all__ = ["PRE_LOGITS", "NacPass", "default_nac_layers", "vit_blocks", "vit_depth", "nac_roles", "final_norm_readout",
           "forward_with_nac", "nac_states", "nac_plan", "describe_readout", "pool_state"]

log = logging.getLogger(__name__)

#: reserved layer name: the classifier's input (pooled penultimate feature)
PRE_LOGITS = "pre_logits"


def default_nac_layers(model: nn.Module) -> list[str]:
    """NAC layers for a timm model, deepest first (the NAC release's choice where it has one).

    * ViT-like (timm ``VisionTransformer`` incl. DeiT and DINOv2, ``Eva`` incl. EVA02 and DINOv3,
      ``Xcit``): the release's ViT-B/16 layers, the final LayerNorm (torchvision ``encoder.ln`` =
      timm ``norm``, or ``fc_norm`` where the norm runs after pooling) and ``ln_2`` of the last
      three blocks (timm ``<block>.norm2`` of :func:`vit_blocks`, e.g. ``blocks.{L-1,L-2,L-3}.norm2``;
      XCiT's last blocks are its class-attention blocks ``cls_attn_blocks.{1,0}``).
    * every other model: ``pre_logits`` plus the outputs of the three feature stages before the
      last one, from timm's ``feature_info`` (module names). For ResNets this is the release's
      ImageNet choice ``avgpool, layer3, layer2, layer1`` (``pre_logits`` = avgpool's output).
      Models without ``feature_info`` get ``["pre_logits"]``.
    """
    blocks = vit_blocks(model)
    if blocks is not None:
        return [_final_norm(model)] + [f"{b}.norm2" for b in blocks[::-1][:3]]
    modules = [e["module"] for e in _feature_info(model)]
    return [PRE_LOGITS] + modules[-2:-5:-1]


def _vit_like(model: nn.Module) -> bool:
    models = optional("timm.models")
    return isinstance(model, (models.vision_transformer.VisionTransformer, models.eva.Eva, models.xcit.Xcit))


def vit_blocks(model: nn.Module) -> list[str] | None:
    """Module names of a ViT-like timm model's transformer blocks in forward order (``blocks.i``,
    then XCiT's ``cls_attn_blocks.j``); None for any other model."""
    if not _vit_like(model):
        return None
    names = [f"blocks.{i}" for i in range(len(model.blocks))]
    return names + [f"cls_attn_blocks.{j}" for j in range(len(getattr(model, "cls_attn_blocks", None) or ()))]


def vit_depth(model: nn.Module) -> int | None:
    """Number of transformer blocks of a ViT-like timm model (:func:`vit_blocks`), else None."""
    blocks = vit_blocks(model)
    return None if blocks is None else len(blocks)


def _final_norm(model: nn.Module) -> str:
    norm = getattr(model, "norm", None)
    return "norm" if isinstance(norm, nn.Module) and not isinstance(norm, nn.Identity) else "fc_norm"


def nac_roles(model: nn.Module, layers: list[str]) -> dict[str, int]:
    """Each of ``layers`` that the release's ViT recipe covers, with its place in it: 0 = the final
    norm, k = ``norm2`` of the k-th block from the last (k = 1, 2, 3). Empty for a model that is not
    ViT-like. :mod:`oodeval.detectors.defaults` gives each its (O, M, alpha) from this."""
    blocks = vit_blocks(model)
    if blocks is None:
        return {}
    places = {_final_norm(model): 0} | {f"{b}.norm2": k for k, b in enumerate(blocks[::-1][:3], start=1)}
    return {name: places[name] for name in layers if name in places}


def final_norm_readout(model: nn.Module) -> tuple[str, str, int] | None:
    """``(layer, pool, prefix)``: how a ViT-like model's classifier reads its final token norm
    ``layer`` - ``pool`` "token" (the CLS token, index 0) or "avg" (the mean of the tokens after the
    ``prefix`` CLS/register tokens). None where the final norm runs after pooling (``fc_norm``) or
    the model is not ViT-like. Another pooling (max, attention pooling) is refused: the release
    has no reading for it."""
    if not _vit_like(model) or _final_norm(model) != "norm":
        return None
    pool = getattr(model, "global_pool", "token")
    if getattr(model, "attn_pool", None) is not None or pool not in ("token", "avg"):
        raise InputError(f"{type(model).__name__} pools its tokens with {pool!r}: NAC's final-norm readout "
                         f"knows the CLS token and the token mean only; pass nac_layers without 'norm'")
    return "norm", pool, int(getattr(model, "num_prefix_tokens", 1))


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
    ``pre_logits`` (default: timm's ``model.get_classifier()``); a head that is not a module of
    ``model`` is a linear probe on a frozen backbone (``num_classes=0``, so ``model(x)`` returns the
    pre-logits): the logits the gradient flows from are then ``classifier(model(x))``.
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
    probe = all(classifier is not m for m in modules.values())
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
            if probe:
                logits = classifier(logits)
            missing = [n for n in [*layers, PRE_LOGITS] if n not in captured]
            if missing:
                raise InputError(f"layers {missing} were not reached in the forward pass")
            loss = -torch.log_softmax(logits.float(), dim=-1).mean(dim=-1).sum()
            grads = torch.autograd.grad(loss, [captured[n] for n in layers])
    finally:
        for h in hooks:
            h.remove()
    channels = {e["module"]: int(e["num_chs"]) for e in _feature_info(model)}
    readout = final_norm_readout(model) if "norm" in layers else None
    states = {}
    for name, g in zip(layers, grads):
        o = captured[name].detach()
        if readout is not None and name == readout[0] and o.ndim == 3:
            o, g = _classifier_tokens(o, g, readout[1], readout[2])
        states[name] = (pool_state(o, channels.get(name)) * pool_state(g, channels.get(name))).float()
    features = captured[PRE_LOGITS].detach().float()
    with torch.no_grad(), torch.autocast(device_type=features.device.type, enabled=False):
        logits32 = classifier(features)  # the float32 head on the stored features, whatever the trunk's autocast
    return NacPass(logits32.float(), features, states)


def describe_readout(model: nn.Module, layers: list[str]) -> dict[str, str]:
    """In words, how each token layer among ``layers`` is read (recorded as ``meta["nac_readout"]``)."""
    readout = final_norm_readout(model) if "norm" in layers else None
    out = {}
    for name in layers:
        if readout is not None and name == readout[0]:
            out[name] = "CLS token" if readout[1] == "token" else f"patch-token mean ({readout[2]} prefix tokens left out)"
        elif name in ("norm", "fc_norm") and vit_blocks(model) is not None:
            out[name] = "pooled vector (fc_norm runs after pooling)" if name == "fc_norm" else "sum over tokens"
        elif name.endswith(".norm2") and vit_blocks(model) is not None:
            out[name] = "sum over tokens"
    return out


def _classifier_tokens(o: Tensor, g: Tensor, pool: str, prefix: int) -> tuple[Tensor, Tensor]:
    """The final norm's output and gradient at what the classifier reads (:func:`final_norm_readout`):
    the CLS token, or the patch-token mean of the output with the sum of the gradients on it."""
    if pool == "token":
        return o[:, 0], g[:, 0]
    return o[:, prefix:].mean(dim=1), g[:, prefix:].sum(dim=1)


def nac_states(model: nn.Module, images: Tensor, layers: list[str]) -> tuple[Tensor, dict[str, Tensor]]:
    """Logits (B, C) and NAC states {layer: (B, C_layer)} for one batch; see module docstring.

    Store each state as FeatureSet extra ``f"nac/{layer}"`` (the ``nac`` detector reads
    ``extra:nac/*``).
    """
    out = forward_with_nac(model, images, layers)
    return out.logits, out.states


def nac_plan(model: str, model_kwargs: dict | None = None) -> dict | None:
    """What an extraction of timm ``model`` with taps records about them - ``taps`` (the default
    layers), ``nac_roles`` and ``depth`` - from an instance on the meta device (no weights, no
    memory, no download), for ``oodeval run --check``. None for a model that is not timm's or
    cannot be built."""
    kind, name, _ = parse_model_name(model)
    if kind != "timm":
        return None
    try:
        with torch.device("meta"):
            net = optional("timm").create_model(name, pretrained=False, **dict(model_kwargs or {}))
    except (RuntimeError, ValueError, TypeError, KeyError) as exc:
        log.debug("cannot build %s on the meta device: %s", model, exc)
        return None
    layers = default_nac_layers(net)
    return {"taps": layers, "nac_roles": nac_roles(net, layers), "nac_readout": describe_readout(net, layers), "depth": vit_depth(net)}
