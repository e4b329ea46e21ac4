"""A deep ensemble's FeatureSet: several models' FeatureSets of the same dataset as one.

The members are models trained on the same data (several seeds of one architecture, or several
backbones) whose stored FeatureSets of one dataset hold the same rows in the same order. The
ensemble's FeatureSet keeps each member's logits as the extra ``ensemble/<k>`` (k = 0, 1, ...),
their mean (in float64, stored in the members' dtype) as its ``logits`` (what OpenOOD's ``ensemble`` postprocessor softmaxes),
the first member's features as its ``features`` (a placeholder, not copied: the ensemble is a
logit-space object and has no head; a feature-space detector belongs on the members, whose
features side by side would cost M times their memory per set), and the members in ``meta["ensemble"]`` (name, model, weights hash and content hash of each),
which the ``deep_ensemble`` detector records in its results.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import InputError
from .featureset import FeatureSet

__all__ = ["PREFIX", "ensemble_featureset", "member_logits"]

PREFIX = "ensemble/"


def _describe(name: str, fs: FeatureSet) -> dict:
    return {"name": name, "model": fs.meta.get("model"), "weights_hash": fs.meta.get("weights_hash"),
            "content_hash": str(fs.meta.get("content_hash") or fs.content_hash())}  # fmt: skip


def ensemble_featureset(members: Sequence[FeatureSet], names: Sequence[str] | None = None) -> FeatureSet:
    """One FeatureSet of ``members`` (at least two FeatureSets of the same dataset: same rows, labels
    and classes), named ``names`` (default ``member0``, ``member1``, ...) in ``meta["ensemble"]``."""
    members = list(members)
    names = [f"member{k}" for k in range(len(members))] if names is None else list(names)
    if len(members) < 2:
        raise InputError(f"an ensemble needs at least two members, got {len(members)}")
    if len(names) != len(members) or len(set(names)) != len(names):
        raise InputError(f"an ensemble's members need distinct names, one each: {names} for {len(members)} members")
    first = members[0]
    datasets = {fs.meta.get("dataset") for fs in members}
    for name, fs in zip(names, members):
        if fs.logits is None:
            raise InputError(f"ensemble member {name!r} has no logits (the ensemble averages the members' logits)")
        if len(fs) != len(first) or fs.logits.shape[1] != first.logits.shape[1]:
            raise InputError(f"ensemble member {name!r} has {len(fs)} rows x {fs.logits.shape[1]} classes, member {names[0]!r} "
                             f"{len(first)} x {first.logits.shape[1]}: the members must score the same dataset with the same classes")
        if not np.array_equal(fs.labels, first.labels):
            raise InputError(f"ensemble member {name!r} has other labels than {names[0]!r}: the members must hold the same rows in the same order")
    if len(datasets) > 1:
        raise InputError(f"the ensemble's members come from different datasets: {sorted(map(str, datasets))}")
    logits = [np.asarray(fs.logits) for fs in members]
    mean = (sum(f.astype(np.float64) for f in logits) / len(logits)).astype(np.result_type(*logits))
    meta = {"model": "ensemble(" + "+".join(names) + ")", "dataset": first.meta.get("dataset"),
            "ensemble": {"members": [_describe(n, fs) for n, fs in zip(names, members)]}}  # fmt: skip
    for key in ("role", "n_classes", "class_names"):
        if key in first.meta:
            meta[key] = first.meta[key]
    features = first.features  # no copy (a memory-mapped set stays so): see the module docstring
    extras = {f"{PREFIX}{k}": f for k, f in enumerate(logits)}
    return FeatureSet(features=features, labels=np.asarray(first.labels), logits=mean, extras=extras, meta=meta)


def member_logits(x: FeatureSet) -> list[np.ndarray]:
    """The members' logits of an ensemble FeatureSet, in member order (an InputError when ``x`` is none)."""
    members = (x.meta.get("ensemble") or {}).get("members")
    if not members:
        raise InputError(f"{x.name!r} is not a deep ensemble's FeatureSet: build one with oodeval.features.ensemble.ensemble_featureset "
                         "or an `ensemble = [...]` model table in an experiment")
    missing = [k for k in range(len(members)) if f"{PREFIX}{k}" not in x.extras]
    if missing:
        raise InputError(f"{x.name!r} lacks the logits of ensemble members {missing}")
    return [x.extras[f"{PREFIX}{k}"] for k in range(len(members))]
