"""``oodeval run --check``: everything about an experiment that can be verified offline, before a run.

Checks, each problem reported with what is needed: every dataset resolves (registry name, folder or
manifest; a model's precomputed FeatureSet folder stands in for it), every weights file exists and
loads safely (safetensors, or ``torch.load(weights_only=True)``), every model name exists in timm's or
open_clip's registry (and an open_clip tag in its pretrained table), every vocabulary file and the ID
class-name file exist, and so do a model's probe head file and the ``[selection]`` validation sets, and the
store has the disk the zero-shot models' extraction needs (``experiment.disk``). Nothing is extracted or
computed. ``names_only`` checks the model names alone.
"""

from __future__ import annotations

from pathlib import Path

from .config import DatasetSpec, ExperimentConfig, ModelSpec

__all__ = ["check_experiment"]


def _model_problem(model: ModelSpec) -> str | None:
    """A model name its library cannot build, or None. A ``hf:`` hub id cannot be verified offline (a local
    folder must hold a ``config.json``); a ``package.module:factory`` must import and name a callable."""
    from ..features.backbones import parse_model_name

    kind, name, tag = parse_model_name(model.name)
    if kind == "timm":
        import timm

        return None if timm.is_model(name) else f"model {model.label!r}: timm has no model {name!r} (see timm.list_models())"
    if kind == "hf":
        if Path(name).exists() and not (Path(name) / "config.json").is_file():
            return f"model {model.label!r}: {name} has no config.json (expected a transformers model folder)"
        return None
    if kind == "python":
        import importlib

        mod, _, attr = name.partition(":")
        try:
            found = callable(getattr(importlib.import_module(mod), attr, None))
        except ImportError as exc:
            return f"model {model.label!r}: cannot import {mod!r} ({exc})"
        return None if found else f"model {model.label!r}: {mod} has no callable {attr!r}"
    import open_clip

    if name not in open_clip.list_models():
        return f"model {model.label!r}: open_clip has no architecture {name!r} (see open_clip.list_models())"
    if tag is not None and not open_clip.get_pretrained_cfg(name, tag):
        return f"model {model.label!r}: open_clip has no pretrained tag {tag!r} for {name!r} (see open_clip.list_pretrained())"
    return None


def _weights_problem(model: ModelSpec, path: str) -> str | None:
    from ..features.backbones import load_state_dict_file

    try:
        load_state_dict_file(path)
    except (FileNotFoundError, ValueError) as exc:
        return f"model {model.label!r}: {exc}"
    return None


def _dataset_problem(role: str, ds: DatasetSpec, cfg: ExperimentConfig, models: list[ModelSpec]) -> list[str]:
    """A dataset is needed unless every model that reads it brings a precomputed FeatureSet for it."""
    out = []
    for m in models:
        if role in m.features and not (Path(m.features[role]) / "meta.json").is_file():
            out.append(f"model {m.label!r}: features for {role!r}: {m.features[role]} is not a FeatureSet folder (no meta.json)")
    if any(role not in m.features for m in models):
        from ..data import resolve

        if "/" in ds.name and not Path(ds.name).exists():
            out.append(f"dataset {ds.label!r}: {ds.name} does not exist (expected an image folder or a manifest CSV)")
            return out
        try:
            resolve(ds.name, cfg.data_root)
        except (FileNotFoundError, ValueError) as exc:
            out.append(f"dataset {ds.label!r}: {exc}")
    return out


def check_experiment(cfg: ExperimentConfig, names_only: bool = False, disk: list | None = None) -> list[str]:
    """Every problem found in ``cfg`` offline (an empty list when the experiment can run as written).

    ``names_only``: only what needs no inputs in place (model names in their registries), for a file
    such as the paper preset checked before its checkpoints and data are downloaded. ``disk``: the
    ``experiment.disk.estimate_disk`` rows when already computed.
    """
    problems: list[str] = [p for m in cfg.models for p in [_model_problem(m)] if p]
    if names_only:
        return problems
    for m in cfg.models:
        problems += [p for w in dict.fromkeys(m.weights) if w is not None for p in [_weights_problem(m, w)] if p]
        problems += [p for p in [m.head and _weights_problem(m, m.head)] if p]
    supervised = [m for m in cfg.models if m.kind == "supervised"]
    roles = [("id_test", cfg.id_test, list(cfg.models))] + [(d.label, d, list(cfg.models)) for d in cfg.ood]
    if cfg.id_train is not None:
        roles.insert(0, ("id_train", cfg.id_train, supervised))
    if cfg.selection is not None:
        searching = [m for m in cfg.models if any(s.search for s in cfg.detectors_for(m) or ())]
        roles += [("validation_id", cfg.selection.validation_id, searching), ("validation_ood", cfg.selection.validation_ood, searching)]
    for role, ds, models in roles:
        if models:
            problems += _dataset_problem(role, ds, cfg, models)
    zeroshot = [m for m in cfg.models if m.kind == "zero-shot"]
    vocabularies = {s.vocabulary for m in zeroshot for s in (cfg.detectors_for(m) or ()) if s.vocabulary}
    vocabularies |= {s.vocabulary for s in cfg.sweeps} if zeroshot else set()
    problems += [f"vocabulary file {v} does not exist (build it with `oodeval vocab ...`)" for v in sorted(vocabularies) if not Path(v).is_file()]
    if zeroshot and cfg.id_classes is not None and str(cfg.id_classes) != "imagenet1k" and not cfg.id_classes.is_file():
        problems.append(f"[datasets] id_classes: {cfg.id_classes} is neither 'imagenet1k' nor an existing file")
    from .disk import disk_problem, estimate_disk

    problems += [p for p in [disk_problem(cfg, estimate_disk(cfg) if disk is None else disk)] if p]
    return problems
