"""``oodeval run --check``: everything about an experiment that can be verified offline, before a run.

Checks, each problem reported with what is needed: every dataset resolves (registry name, folder or
manifest; a model's precomputed FeatureSet folder stands in for it), every weights file exists and
loads safely (safetensors, or ``torch.load(weights_only=True)``), every model name exists in timm's or
open_clip's registry (and an open_clip tag in its pretrained table), every vocabulary file and the ID
class-name file exist (unless a zero-shot model brings their text embeddings, ``text:<name>``), and so do a
model's probe head file and the ``[selection]`` validation sets, and the store has the disk the zero-shot
models' extraction needs (``experiment.disk``). Nothing is extracted or computed. ``names_only`` checks the
model names alone. :func:`eoe_prompt_notes` says which prompts the EOE vocabularies come from (EOE's
released prompts, ``eoe_prompts``, or oodeval's own wording).
"""

from __future__ import annotations

from pathlib import Path

from .._extras import optional
from ..data import resolve
from ..features.names import parse_model_name
from ..zeroshot.prompts import DEFAULT_NAME, load_prompts
from .config import ExperimentConfig, ExperimentDataset, ModelSpec
from .disk import disk_problem, estimate_disk
from .zeroshot import compact_generations, vocabulary_generation, vocabulary_label, vocabulary_source

__all__ = ["check_experiment", "eoe_prompt_notes"]


def _model_problem(model: ModelSpec) -> str | None:
    """A model name its library cannot build, or None. A ``hf:`` hub id cannot be verified offline (a local
    folder must hold a ``config.json``); a ``package.module:factory`` must import and name a callable.
    A deep ensemble's table builds no model of its own (its members are checked)."""
    if model.ensemble:
        return None
    kind, name, tag = parse_model_name(model.name)
    if kind == "timm":
        return None if optional("timm").is_model(name) else f"model {model.label!r}: timm has no model {name!r} (see timm.list_models())"
    if kind == "hf":
        if Path(name).exists() and not (Path(name) / "config.json").is_file():
            return f"model {model.label!r}: {name} has no config.json (expected a transformers model folder)"
        return None
    if kind == "openood":
        from ..features.openood import ARCHITECTURES

        return None if name in ARCHITECTURES else f"model {model.label!r}: OpenOOD has no network {name!r} here; known: {', '.join('openood:' + n for n in ARCHITECTURES)}"
    if kind == "python":
        import importlib

        mod, _, attr = name.partition(":")
        try:
            found = callable(getattr(importlib.import_module(mod), attr, None))
        except ImportError as exc:
            return f"model {model.label!r}: cannot import {mod!r} ({exc})"
        return None if found else f"model {model.label!r}: {mod} has no callable {attr!r}"
    open_clip = optional("open_clip")
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


def _dataset_problem(role: str, ds: ExperimentDataset, cfg: ExperimentConfig, models: list[ModelSpec]) -> list[str]:
    """A dataset is needed unless every model that reads it brings a precomputed FeatureSet for it."""
    out = []
    for m in models:
        if role in m.features and not (Path(m.features[role]) / "meta.json").is_file():
            out.append(f"model {m.label!r}: features for {role!r}: {m.features[role]} is not a FeatureSet folder (no meta.json)")
    if any(role not in m.features for m in models):
        try:
            resolve(ds.name, cfg.data_root)  # exactly what `run` reads (a path with a `:SPLIT` tail included)
        except (FileNotFoundError, ValueError) as exc:
            missing = "/" in ds.name and not Path(ds.name).exists()
            out.append(f"dataset {ds.label!r}: {ds.name} does not exist (expected an image folder or a manifest CSV)" if missing
                       else f"dataset {ds.label!r}: {exc}")
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
    if cfg.results.suffix != ".parquet":
        problems.append(f"results = {str(cfg.results)!r}: the results table is Parquet, so its path must end in .parquet")
    for m in cfg.models:
        problems += [p for w in dict.fromkeys(m.weights) if w is not None for p in [_weights_problem(m, w)] if p]
        problems += [p for p in [m.head and _weights_problem(m, m.head)] if p]
    own = [m for m in cfg.models if not m.ensemble]  # an ensemble reads its members' FeatureSets
    supervised = [m for m in own if m.kind == "supervised"]
    roles = [("id_test", cfg.id_test, own)] + [(d.label, d, own) for d in cfg.ood]
    if cfg.id_train is not None:
        roles.insert(0, ("id_train", cfg.id_train, supervised))
    if cfg.selection is not None:
        searching = [m for m in cfg.models if any(s.search for s in cfg.detectors_for(m) or ())]
        roles += [("validation_id", cfg.selection.validation_id, searching), ("validation_ood", cfg.selection.validation_ood, searching)]
    for role, ds, models in roles:
        if models:
            problems += _dataset_problem(role, ds, cfg, models)

    zeroshot = [m for m in cfg.models if m.kind == "zero-shot"]
    vocabularies = {s.vocabulary for m in zeroshot for s in (cfg.detectors_for(m) or ())
                    if s.vocabulary and f"text:{vocabulary_label(s.vocabulary)}" not in m.features}  # else its embeddings are given
    vocabularies |= {s.vocabulary for s in cfg.sweeps} if zeroshot else set()
    problems += _missing_vocabularies(sorted(v for v in vocabularies if not Path(v).is_file()))
    needs_names = [m for m in zeroshot if "text:id" not in m.features]
    if needs_names and cfg.id_classes is not None and str(cfg.id_classes) != "imagenet1k" and not cfg.id_classes.is_file():
        problems.append(f"[datasets] id_classes: {cfg.id_classes} is neither 'imagenet1k' nor an existing file")

    problems += [p for p in [disk_problem(cfg, estimate_disk(cfg) if disk is None else disk)] if p]
    return problems


def _missing_vocabularies(paths: list[str]) -> list[str]:
    """One problem per missing vocabulary file, the generations of one vocabulary (``X-gen<g>``) in one
    line (``X-gen{0..29}.json``)."""
    groups: dict[tuple[Path, str, str], list[str]] = {}
    out = []
    for path in paths:
        p = Path(path)
        base, gen = vocabulary_generation(p.stem)
        if gen is None:
            out.append(f"vocabulary file {path} does not exist (build it with `oodeval vocab ...`)")
        else:
            groups.setdefault((p.parent, base, p.suffix), []).append(p.stem)
    for (parent, _, suffix), stems in groups.items():
        out += [f"vocabulary file {parent / (c + suffix)} does not exist (one per LLM generation: `oodeval vocab llm|eoe ...`)"
                for c in compact_generations(stems)]
    return out


def eoe_prompt_notes(cfg: ExperimentConfig) -> tuple[list[str], list[str]]:
    """(notes, problems) about the prompts of the experiment's EOE vocabularies: whether the
    ``eoe_prompts`` file (EOE's released prompts, provided by the user) is set, in place and valid,
    and which existing EOE vocabulary files were generated with oodeval's own wording instead (their
    provenance's ``prompt_file``) or with another prompt file."""
    import json


    zeroshot = [m for m in cfg.models if m.kind == "zero-shot"]
    eoe = sorted({s.vocabulary for m in zeroshot for s in (cfg.detectors_for(m) or ()) if s.name == "eoe" and s.vocabulary})
    if not eoe:
        return [], []
    notes: list[str] = []
    problems: list[str] = []
    want = cfg.eoe_prompts
    if want is None:
        notes.append("EOE vocabularies: no `eoe_prompts` file is set, so `oodeval vocab eoe` words its requests with oodeval's "
                     "own prompts, not the ones released with EOE (docs/zeroshot.md)")
    elif not want.is_file():
        notes.append(f"EOE's released prompts {want} are not in place: write them there (format: docs/zeroshot.md) and build "
                     f"the EOE vocabularies with `oodeval vocab eoe --prompts {want}`; without them oodeval's own wording is used")
    else:
        try:
            load_prompts(want)
        except ValueError as exc:
            problems.append(str(exc))
    own, other = [], []
    for path in eoe:
        if not Path(path).is_file():
            continue
        used = json.loads(vocabulary_source(path)).get("prompt_file")
        if used == DEFAULT_NAME:
            own.append(vocabulary_label(path))
        elif want is not None and used is not None and Path(used).resolve() != want.resolve():
            other.append(f"{vocabulary_label(path)} ({used})")
    if own:
        notes.append(f"{len(own)} EOE vocabulary file(s) were generated with oodeval's own prompt wording, not EOE's released "
                     f"prompts: {', '.join(compact_generations(own))}")
    if other:
        notes.append(f"{len(other)} EOE vocabulary file(s) were generated with a prompt file other than eoe_prompts: {', '.join(other)}")
    return notes, problems
