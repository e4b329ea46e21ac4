"""Per-architecture detector defaults: which backbone family made the features, and what each detector's class says for it.

:func:`resolve_defaults` is the one place where a detector's hyperparameters are chosen from the
model recorded in a FeatureSet's metadata (``meta["model"]``); an explicit hyperparameter always
wins. The backbone family comes from the timm module that registers the model
(:func:`backbone_family`); :data:`FAMILY_NOTES` says for each family why it gets the settings it
gets. ViT-like families (:data:`VIT_LIKE`: ``vit`` = timm ``vision_transformer`` and ``deit``,
incl. DINOv2; ``eva`` = EVA02 and timm's DINOv3; ``xcit``) are ViTs to every release. The
settings themselves, each with the release it comes from, are declared beside each detector's
class (:meth:`oodeval.detectors.base.Detector.backbone_defaults`: NECO's ``maxlogit``, ASH-S's
``percentile``, NAC's ``layer_params`` / ``n_fit``); this module only asks the class.
"""

from __future__ import annotations

from collections.abc import Mapping

from .._extras import optional
from ..features import FeatureSet
from ..features.names import parse_model_name
from . import REGISTRY
from .base import BackboneInfo, Default
from .profiles import KEY, PAPER, entry, profile_defaults

__all__ = ["Default", "BackboneInfo", "backbone_family", "backbone_of", "backbone_defaults", "resolve_defaults", "describe_defaults",
           "FAMILIES", "VIT_LIKE", "FAMILY_NOTES", "family_note"]

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


def backbone_family(model: str | None) -> str:
    """One of :data:`FAMILIES`: a named family, ``other`` (a known model of another family; see
    :func:`family_note`) or ``unknown`` (no or unrecognised model name).

    timm names (``timm:`` prefix and ``.tag`` allowed) are classified by the module that registers
    them; open_clip names by their architecture (``RN50`` -> resnet, ``ViT-B-16`` -> vit); OpenOOD's
    networks (``openood:resnet18_32x32``) are ResNets.
    """
    return _family_and_module(model)[0]


def _family_and_module(model: str | None) -> tuple[str, str | None]:
    if not model:
        return "unknown", None

    kind, name, _ = parse_model_name(model)
    if kind == "open_clip":
        return ("resnet" if name.upper().startswith("RN") else "vit" if name.startswith("ViT") else "other"), None
    if kind == "openood":  # OpenOOD's networks (features.openood) are all ResNet-18s
        return ("resnet" if name.startswith("resnet") else "other"), None
    if kind != "timm":  # a user's own nn.Module or factory
        return "unknown", None

    models = optional("timm.models")  # a timm name's family (and so its defaults) comes from timm's registry
    arch = models.split_model_name_tag(name)[0]
    if not models.is_model(arch):
        return "unknown", None
    module = models.model_entrypoint(arch).__module__.rsplit(".", 1)[-1]
    return _MODULES.get(module, "other"), module


def family_note(model: str | None) -> str:
    """Why ``model``'s family gets its settings; for ``other``, which module it is and what it gets."""
    family, module = _family_and_module(model)
    if family == "other":
        where = f"timm module {module}" if module else "this open_clip architecture"
        return (f"{where} is none of the releases' families: the paper's ASH-S p=90, NAC's ResNet values "
                f"in depth order, NECO's non-ResNet max-logit factor")
    return FAMILY_NOTES[family]


def backbone_of(source: FeatureSet | Mapping | None) -> BackboneInfo:
    """The :class:`~oodeval.detectors.base.BackboneInfo` record of a FeatureSet (or its metadata):
    family, model, the NAC taps recorded (``meta["taps"]``, else its ``nac/<layer>`` extras) and
    whether it has logits (a metadata mapping is taken to have them)."""
    if isinstance(source, FeatureSet):
        meta, has_logits = source.meta, source.logits is not None
        taps = meta.get("taps") or [k[len("nac/") :] for k in sorted(source.extras) if k.startswith("nac/")]
    else:
        meta, has_logits = source or {}, True
        taps = meta.get("taps") or []
    family = backbone_family(meta.get("model"))
    return BackboneInfo(family=family, vit_like=family in VIT_LIKE, model=meta.get("model"), taps=tuple(taps),
                    has_logits=has_logits, meta=meta)  # fmt: skip


def _class(name: str | type) -> type:
    return name if isinstance(name, type) else REGISTRY[name]


def backbone_defaults(name: str | type, source: FeatureSet | Mapping | None) -> dict[str, Default]:
    """The hyperparameters of detector ``name`` (a registry name or the class) that depend on the
    backbone recorded in ``source`` (a FeatureSet or its metadata), with their sources, as its class
    declares them; empty when none does or the backbone is unknown."""
    backbone = backbone_of(source)
    if backbone.family == "unknown":
        return {}
    return dict(_class(name).backbone_defaults(backbone))


def resolve_defaults(name: str | type, source: FeatureSet | Mapping | None, explicit: Mapping | None = None,
                     profile: str = PAPER) -> dict:
    """Constructor arguments of detector ``name``: its backbone defaults for ``source``, overridden
    by the values of the defaults ``profile`` (:mod:`oodeval.detectors.profiles`; ``paper``: none),
    overridden by ``explicit`` (the user's hyperparameters, which always win; a hyperparameter the
    class lists in ``merged_params``, NAC's ``layer_params``, is merged per key and per inner key)."""
    explicit = dict(explicit or {})
    out = {k: d.value for k, d in backbone_defaults(name, source).items()}
    out.update({k: d.value for k, d in profile_defaults(_class(name).name, profile).items()})
    for param in _class(name).merged_params:
        if isinstance(out.get(param), dict) and explicit.get(param):
            merged = {key: dict(p) for key, p in out[param].items()}
            for key, p in dict(explicit.pop(param)).items():
                merged.setdefault(key, {}).update(p)
            out[param] = merged
    out.update(explicit)
    return out


def describe_defaults(names: list[str], source: FeatureSet | Mapping | None, explicit: Mapping[str, Mapping] | None = None) -> list[str]:
    """A line naming the backbone, then what each of ``names`` notes about it
    (:meth:`~oodeval.detectors.base.Detector.backbone_notes`), then one line per backbone-dependent
    hyperparameter and per value of the detector's defaults profile (``explicit[name]["defaults"]``,
    :mod:`oodeval.detectors.profiles`): its value and source, or the user's value where it wins."""
    explicit = explicit or {}
    backbone = backbone_of(source)
    lines = [f"backbone {backbone.model or '(not recorded)'}: family {backbone.family} ({family_note(backbone.model)})"]
    for name in names:
        lines += [f"  {name} {note}" for note in _class(name).backbone_notes(backbone)]
    for name in names:
        mine = explicit.get(name, {})
        profile = mine.get(KEY, PAPER)
        overlaid = profile_defaults(_class(name).name, profile)
        for param, d in {**backbone_defaults(name, source), **overlaid}.items():
            what = f"{profile} default" if param in overlaid else "backbone default"
            if param in mine:
                lines.append(f"  {name}.{param} = {_show(mine[param])} (set explicitly; {what} {_show(d.value)} [{d.source}])")
            else:
                lines.append(f"  {name}.{param} = {_show(d.value)}  [{d.source}]")
        if profile != PAPER and entry(_class(name).name, profile) is None:
            lines.append(f"  {name}: not in {profile}'s methods: the paper's defaults")
    return lines


def _show(value: object) -> str:
    """NAC layer_params as ``layer O/M/alpha, ...``; anything else as its repr."""
    if isinstance(value, dict) and all(isinstance(v, dict) for v in value.values()):
        return ", ".join(f"{k} {v.get('O')}/{v.get('M')}/{v.get('alpha'):g}" for k, v in value.items())
    return repr(value)
