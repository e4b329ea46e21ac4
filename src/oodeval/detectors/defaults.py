"""Per-architecture detector defaults: the releases' own settings for the backbone that made the features.

:func:`resolve_defaults` is the one place where a detector's hyperparameters are chosen from the
model recorded in a FeatureSet's metadata (``meta["model"]``); an explicit hyperparameter always
wins. The backbone family comes from the timm module that registers the model
(:func:`backbone_family`); :data:`FAMILY_NOTES` says for each family why it gets the settings it
gets. ViT-like families (:data:`VIT_LIKE`: ``vit`` = timm ``vision_transformer`` and ``deit``,
incl. DINOv2; ``eva`` = EVA02 and timm's DINOv3; ``xcit``) are ViTs to every release below. The
settings, each from its release:

* NECO ``maxlogit``: True for every non-ResNet model (NECO release, ``neco()``: ``if
  model_architecture_type != 'resnet': score *= maxlogit``); needs logits, so it stays off for
  features without them (a VLM without a probe head).
* ASH-S ``percentile``: ResNet-50 / MobileNetV2 90, ViT 95, DenseNet-121 99 (andrijazz/ash
  ``config/{imagenet,mobilenet,vit,densenet}_config.yml``: ``ash_s@90``, ``ash_s@90``, ``ash_s@95``,
  ``ash_s@99``); ViT-like families take the ViT value; every other family keeps the paper's 90
  (the release runs no ASH-S on ConvNeXt, Swin or EfficientNet).
* NAC ``layer_params`` / ``n_fit`` (BierOne/ood_coverage ``configs/postprocessors/nac/``):
  ResNet ``resnet/nac_imagenet.yml`` (avgpool/layer3/layer2/layer1, ``valid_num`` 1000, the
  class defaults of :class:`~oodeval.detectors.nac.NAC`); ViT ``vit/nac_imagenet.yml``: the final
  LayerNorm (``encoder.ln`` = timm ``norm`` / ``fc_norm``) O/M/alpha 500/50/100 and ``ln_2`` of the
  last three blocks (timm ``<block>.norm2``, :func:`oodeval.features.taps.vit_blocks`) 50/500/1,
  10/500/10, 10/1000/1, ``valid_num`` 50000, for every ViT-like family on its own block names (the
  place of each tap is recorded at extraction, ``meta["nac_roles"]``). The release has no setting
  for other families; they get the ResNet values layer by layer in depth order (deepest tap =
  avgpool's) and ``n_fit`` 1000.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..features import FeatureSet
from .nac import NAC_DEFAULTS, NAC_N_FIT, NAC_VIT_BLOCKS, NAC_VIT_NORM

__all__ = ["Default", "backbone_family", "backbone_defaults", "resolve_defaults", "describe_defaults", "FAMILIES", "VIT_LIKE",
           "FAMILY_NOTES", "family_note"]

#: timm module (``timm.models.<module>``) -> backbone family
_MODULES = {
    "resnet": "resnet", "resnetv2": "resnet", "vision_transformer": "vit", "deit": "vit", "eva": "eva",
    "xcit": "xcit", "densenet": "densenet", "swin_transformer": "swin", "swin_transformer_v2": "swin",
    "convnext": "convnext", "efficientnet": "efficientnet",
}  # fmt: skip
FAMILIES = ("resnet", "vit", "eva", "xcit", "densenet", "swin", "convnext", "efficientnet", "other", "unknown")
#: families the releases' ViT settings apply to: patch-token transformers read at a final LayerNorm
VIT_LIKE = ("vit", "eva", "xcit")
#: why each family gets the settings it gets (printed by ``oodeval score`` and ``run --check``)
FAMILY_NOTES = {
    "resnet": "ResNet, incl. BiT (timm resnet, resnetv2): the releases' ResNet-50 settings",
    "vit": "ViT (timm vision_transformer, deit; incl. DeiT, CLIP-ViT, DINOv2): the releases' ViT settings",
    "eva": "ViT (timm eva: EVA02, DINOv3): the releases' ViT settings on its own block names",
    "xcit": "ViT-like (timm xcit: a ViT with class-attention blocks): the releases' ViT settings",
    "densenet": "DenseNet: ASH-S's DenseNet-121 setting; no NAC release setting",
    "swin": "Swin (timm swin_transformer, swin_transformer_v2): no ASH-S or NAC release setting",
    "convnext": "ConvNeXt, incl. V2 (timm convnext): no ASH-S or NAC release setting",
    "efficientnet": "EfficientNet, incl. V2 (timm efficientnet): no ASH-S or NAC release setting",
    "unknown": "no model recorded or not in timm/open_clip: the detectors' class defaults",
}

_NECO = "NECO release: max-logit factor for every non-ResNet model"
_ASH = {
    "resnet": (90.0, "ASH release config/imagenet_config.yml: ash_s@90 (ResNet-50)"),
    "vit": (95.0, "ASH release config/vit_config.yml: ash_s@95 (ViT)"),
    "eva": (95.0, "ASH release config/vit_config.yml: ash_s@95 (ViT; EVA02/DINOv3 are ViTs)"),
    "xcit": (95.0, "ASH release config/vit_config.yml: ash_s@95 (ViT; XCiT is ViT-like)"),
    "densenet": (99.0, "ASH release config/densenet_config.yml: ash_s@99 (DenseNet-121)"),
}


@dataclass(frozen=True)
class Default:
    """A resolved hyperparameter value and where it comes from."""

    value: object
    source: str


def backbone_family(model: str | None) -> str:
    """One of :data:`FAMILIES`: a named family, ``other`` (a known model of another family; see
    :func:`family_note`) or ``unknown`` (no or unrecognised model name).

    timm names (``timm:`` prefix and ``.tag`` allowed) are classified by the module that registers
    them; open_clip names by their architecture (``RN50`` -> resnet, ``ViT-B-16`` -> vit).
    """
    return _family_and_module(model)[0]


def _family_and_module(model: str | None) -> tuple[str, str | None]:
    if not model:
        return "unknown", None
    from ..features.names import parse_model_name

    kind, name, _ = parse_model_name(model)
    if kind == "open_clip":
        return ("resnet" if name.upper().startswith("RN") else "vit" if name.startswith("ViT") else "other"), None
    if kind != "timm":  # a user's own nn.Module or factory
        return "unknown", None
    from .._extras import needs

    with needs():  # a timm name's family (and so its defaults) comes from timm's registry
        from timm.models import is_model, model_entrypoint, split_model_name_tag

    arch = split_model_name_tag(name)[0]
    if not is_model(arch):
        return "unknown", None
    module = model_entrypoint(arch).__module__.rsplit(".", 1)[-1]
    return _MODULES.get(module, "other"), module


def family_note(model: str | None) -> str:
    """Why ``model``'s family gets its settings; for ``other``, which module it is and what it gets."""
    family, module = _family_and_module(model)
    if family == "other":
        where = f"timm module {module}" if module else "this open_clip architecture"
        return (f"{where} is none of the releases' families: the paper's ASH-S p=90, NAC's ResNet values "
                f"in depth order, NECO's non-ResNet max-logit factor")
    return FAMILY_NOTES[family]


def _meta_and_taps(source: FeatureSet | Mapping | None) -> tuple[Mapping, list[str], bool]:
    if isinstance(source, FeatureSet):
        taps = source.meta.get("taps") or [k[len("nac/") :] for k in sorted(source.extras) if k.startswith("nac/")]
        return source.meta, list(taps), source.logits is not None
    meta = source or {}
    return meta, list(meta.get("taps") or []), True


def _nac_layers(family: str, taps: list[str], roles: Mapping | None, depth: int | None) -> dict[str, dict]:
    """Per-layer (O, M, alpha) of the recorded NAC taps for ``family``. A ViT block's setting
    depends on its place from the last block: ``roles`` (``meta["nac_roles"]``, recorded at
    extraction: 0 = final norm, k = k-th block from the last) where present; else parsed from
    ``blocks.N.norm2`` with ``depth`` (``meta["depth"]``, the block count; without it the deepest
    tapped block counts as the last)."""
    if family not in VIT_LIKE:  # ResNet's (O, M, alpha), deepest first, layer by layer
        return {name: dict(p) for name, p in zip(taps, NAC_DEFAULTS.values())}
    recipe = (NAC_VIT_NORM, *NAC_VIT_BLOCKS)
    if roles:
        return {name: dict(recipe[int(roles[name])]) for name in taps if name in roles and 0 <= int(roles[name]) < len(recipe)}
    blocks = {}
    for name in taps:
        parts = name.split(".")
        if len(parts) == 3 and parts[0] == "blocks" and parts[2] == "norm2" and parts[1].isdigit():
            blocks[name] = int(parts[1])
    last = depth - 1 if depth else max(blocks.values(), default=0)
    out = {name: dict(NAC_VIT_NORM) for name in taps if name in ("norm", "fc_norm")}
    for name, i in blocks.items():
        if 0 <= last - i < len(NAC_VIT_BLOCKS):
            out[name] = dict(NAC_VIT_BLOCKS[last - i])
    return out


def backbone_defaults(name: str, source: FeatureSet | Mapping | None) -> dict[str, Default]:
    """The hyperparameters of detector ``name`` that depend on the backbone recorded in ``source``
    (a FeatureSet or its metadata), with their sources; empty when none does."""
    meta, taps, has_logits = _meta_and_taps(source)
    family = backbone_family(meta.get("model"))
    if family == "unknown":
        return {}
    if name == "neco":
        if family == "resnet":
            return {"maxlogit": Default(False, _NECO + " (ResNet: off)")}
        if not has_logits:
            return {"maxlogit": Default(False, _NECO + "; these features have no logits, so off")}
        return {"maxlogit": Default(True, _NECO)}
    if name == "ash_s":
        value, src = _ASH.get(family, (90.0, f"no ASH release setting for {family}: the paper's ImageNet p=90"))
        return {"percentile": Default(value, src)}
    if name == "nac":
        vit = family in VIT_LIKE
        if family == "resnet":
            src = "NAC release resnet/nac_imagenet.yml"
        elif vit:
            src = "NAC release vit/nac_imagenet.yml" + ("" if family == "vit" else f" ({family} is a ViT)")
        else:
            src = f"no NAC release setting for {family}: ResNet-50's, layer by layer in depth order"
        out = {"n_fit": Default(NAC_N_FIT["vit" if vit else "resnet"], src)}
        if taps and family != "resnet":  # ResNet layers are the NAC class defaults, by name
            out["layer_params"] = Default(_nac_layers(family, taps, meta.get("nac_roles"), meta.get("depth")), src)
        return out
    return {}


def resolve_defaults(name: str, source: FeatureSet | Mapping | None, explicit: Mapping | None = None) -> dict:
    """Constructor arguments of detector ``name``: its backbone defaults for ``source`` overridden
    by ``explicit`` (the user's hyperparameters, which always win; NAC's ``layer_params`` are
    merged per layer and per key)."""
    explicit = dict(explicit or {})
    out = {k: d.value for k, d in backbone_defaults(name, source).items()}
    if name == "nac" and isinstance(out.get("layer_params"), dict) and explicit.get("layer_params"):
        merged = {layer: dict(p) for layer, p in out["layer_params"].items()}
        for layer, p in dict(explicit.pop("layer_params")).items():
            merged.setdefault(layer, {}).update(p)
        out["layer_params"] = merged
    out.update(explicit)
    return out


def describe_defaults(names: list[str], source: FeatureSet | Mapping | None, explicit: Mapping[str, Mapping] | None = None) -> list[str]:
    """A line naming the backbone, then one line per backbone-dependent hyperparameter of
    ``names``: its value and source, or the user's value where it wins."""
    explicit = explicit or {}
    meta, _, _ = _meta_and_taps(source)
    family = backbone_family(meta.get("model"))
    lines = [f"backbone {meta.get('model') or '(not recorded)'}: family {family} ({family_note(meta.get('model'))})"]
    readout = meta.get("nac_readout") or {}
    if "nac" in names and readout:
        lines.append("  nac reads " + "; ".join(f"{layer}: {how}" for layer, how in readout.items()))
    for name in names:
        for param, d in backbone_defaults(name, source).items():
            mine = explicit.get(name, {})
            if param in mine:
                lines.append(f"  {name}.{param} = {_show(mine[param])} (set explicitly; backbone default {_show(d.value)} [{d.source}])")
            else:
                lines.append(f"  {name}.{param} = {_show(d.value)}  [{d.source}]")
    return lines


def _show(value: object) -> str:
    """NAC layer_params as ``layer O/M/alpha, ...``; anything else as its repr."""
    if isinstance(value, dict) and all(isinstance(v, dict) for v in value.values()):
        return ", ".join(f"{k} {v.get('O')}/{v.get('M')}/{v.get('alpha'):g}" for k, v in value.items())
    return repr(value)
