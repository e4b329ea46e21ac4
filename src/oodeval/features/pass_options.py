"""The extraction options of the methods that need the network (docs/detectors.md, "Methods that
need the network"): which passes exist, their settings and defaults, and how a setting is written.

A pass runs during the one extraction of a (model, dataset) beside the plain forward and stores
its arrays as FeatureSet extras ``<kind>/<name>`` (:mod:`oodeval.features.passes`). Its settings
enter the cache key and ``meta["passes"][kind]``, so another setting is another entry, never a
stale one. Written as ``--odin T=1000,eps=0.0014`` on the command line (``--odin`` alone: the
defaults) or ``odin = {temperature = 1000, noise = 0.0014}`` (``odin = true``) in an experiment's
model table. This module imports no torch (the experiment config reads it).

======== ================================================ ===================================
kind     settings (default)                               source of the defaults
======== ================================================ ===================================
odin     temperature (1000), noise (0.0014), std (model)  OpenOOD v1.5 ``odin.yml``
mds      noise (0.0014), layers (model's stages), fit     OpenOOD v1.5 ``mds_ensemble.yml``
gram     powers (10: p = 1..10), layers (model's stages)  OpenOOD v1.5 ``gram_postprocessor``
rankfeat blocks (model's last two stages), iterations (0)  OpenOOD v1.5 ``rankfeat.yml`` (SVD)
mcd      samples (5), p (0.5), where ("head"), seed (0)   OpenOOD v1.5 ``dropout.yml``
adascale o (0.05), step (0.5)                             OpenOOD ``adascale_postprocessor.py``
iodin    temperature (1000), noise (0.0014), std (model)  OpenOOD ``iodin.yml``
======== ================================================ ===================================

``std``: the per-channel standard deviation of the model's input normalisation; the sign gradient
is divided by it so that ``noise`` is a step in [0, 1] pixel units (default: timm's data config;
for your own module, the ``Normalize`` its transform ends in (after ``ToTensor``); a transform of
another shape leaves the step in model-input units unless ``std`` is given). ``rankfeat``'s ``iterations``: 0 = the exact SVD (OpenOOD's default), k > 0 = k steps of the power
iteration (the paper's faster form, OpenOOD's ``accelerate`` with 20). ``mds``'s ``fit``: the ID-train FeatureSet folder extracted with
``--mds noise=0`` whose Gaussians guide the perturbation (a scored set with ``noise > 0`` needs it).
``adascale``'s ``o``: the fraction of the input's values perturbed (those with the smallest gradient
magnitude), each by ``step`` in model-input units (the release's 0.5, not divided by ``std``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .._io import hash_arrays
from ..errors import InputError

__all__ = ["KINDS", "DEFAULTS", "ALIASES", "PassSpec", "parse_pass", "option_hint", "require_pass", "fit_digests"]

#: every pass, in the order extraction runs them
KINDS = ("odin", "mds", "gram", "rankfeat", "mcd", "adascale", "iodin")

#: each pass's settings and defaults (None: from the model, see the module docstring)
DEFAULTS: dict[str, dict[str, object]] = {
    "odin": {"temperature": 1000.0, "noise": 0.0014, "std": None},
    "mds": {"noise": 0.0014, "layers": None, "fit": None, "std": None},
    "gram": {"powers": 10, "layers": None},
    "rankfeat": {"blocks": None, "iterations": 0},
    "mcd": {"samples": 5, "p": 0.5, "where": "head", "seed": 0},
    "adascale": {"o": 0.05, "step": 0.5},
    "iodin": {"temperature": 1000.0, "noise": 0.0014, "std": None},
}

#: the peers' short names for settings (``T=1000,eps=0.0014``)
ALIASES = {"T": "temperature", "eps": "noise", "magnitude": "noise", "n": "samples", "dropout_p": "p"}

_EXAMPLE = {"odin": "T=1000,eps=0.0014", "mds": "noise=0.0014,fit=ID_TRAIN_FEATURESET", "gram": "powers=10",
            "rankfeat": "blocks=layer3+layer4", "mcd": "samples=5,p=0.5", "adascale": "o=0.05", "iodin": "T=1000,eps=0.0014"}  # fmt: skip


def option_hint(kind: str) -> str:
    """How a user asks for the pass ``kind``, for error messages."""
    table = {"odin": "{temperature = 1000, noise = 0.0014}", "mds": "{noise = 0.0014}", "gram": "{powers = 10}",
             "rankfeat": "true", "mcd": "{samples = 5, p = 0.5}", "adascale": "{o = 0.05}", "iodin": "{temperature = 1000, noise = 0.0014}"}  # fmt: skip
    return f"extract with --{kind} {_EXAMPLE[kind]} (or {kind} = {table[kind]} in the experiment's model table)"


@dataclass(frozen=True)
class PassSpec:
    """One pass with its settings (every key of ``DEFAULTS[kind]``, defaults filled in)."""

    kind: str
    settings: tuple[tuple[str, object], ...]

    def get(self, name: str) -> object:
        return dict(self.settings)[name]

    def describe(self) -> dict:
        """The settings as recorded in the cache key and ``meta["passes"]``."""
        return {"kind": self.kind, **{k: (list(v) if isinstance(v, tuple) else v) for k, v in self.settings}}


def _value(kind: str, key: str, raw: object) -> object:
    """A setting's value checked and normalised (numbers as float/int, lists as tuples)."""
    if isinstance(raw, str):
        text = raw.strip()
        if key in ("layers", "blocks", "std"):
            raw = [t for t in text.replace("+", " ").replace(";", " ").split() if t]
        elif key in ("where", "fit"):
            raw = text
        else:
            try:
                raw = float(text) if any(c in text for c in ".eE") else int(text)
            except ValueError:
                raise InputError(f"--{kind}: {key}={raw!r} is not a number") from None
    if key in ("layers", "blocks"):
        if not (isinstance(raw, (list, tuple)) and raw and all(isinstance(v, str) for v in raw)):
            raise InputError(f"{kind}: {key} must be a list of module names, got {raw!r}")
        return tuple(raw)
    if key == "std":
        if not (isinstance(raw, (list, tuple)) and raw and all(isinstance(v, (int, float, str)) for v in raw)):
            raise InputError(f"{kind}: std must be a list of per-channel standard deviations, got {raw!r}")
        vals = tuple(float(v) for v in raw)
        if min(vals) <= 0:
            raise InputError(f"{kind}: std must be positive, got {list(vals)}")
        return vals
    if key == "where":
        if raw not in ("head", "model"):
            raise InputError(f"mcd: where must be 'head' (dropout on the classifier's input) or 'model' (the model's own dropout), got {raw!r}")
        return raw
    if key == "fit":
        if not isinstance(raw, str):
            raise InputError(f"mds: fit must be the path of an ID-train FeatureSet, got {raw!r}")
        return raw
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise InputError(f"{kind}: {key} must be a number, got {raw!r}")
    if key in ("powers", "samples", "seed", "iterations"):
        low = {"seed": 0, "samples": 2, "iterations": 0}.get(key, 1)
        if raw != int(raw) or raw < low:
            raise InputError(f"{kind}: {key} must be an integer >= {low}, got {raw!r}")
        return int(raw)
    if key == "temperature" and raw <= 0:
        raise InputError(f"{kind}: temperature must be > 0, got {raw}")
    if key == "noise" and raw < 0:
        raise InputError(f"{kind}: noise must be >= 0, got {raw}")
    if key == "o" and not 0 < raw <= 1:
        raise InputError(f"adascale: o (the fraction of input values perturbed) must be in (0, 1], got {raw}")
    if key == "step" and raw <= 0:
        raise InputError(f"adascale: step must be > 0, got {raw}")
    if key == "p" and not 0 < raw < 1:
        raise InputError(f"mcd: p must be in (0, 1), got {raw}")
    return float(raw)


def parse_pass(kind: str, value: object) -> PassSpec | None:
    """``value`` (True / "" for the defaults, a "k=v,k=v" string, or a mapping) as a PassSpec of
    ``kind``; None for False / None (no pass). Unknown settings are refused, naming the known ones."""
    if kind not in DEFAULTS:
        raise InputError(f"unknown network pass {kind!r}; known: {', '.join(KINDS)}")
    if value is None or value is False:
        return None
    if value is True:
        given: Mapping[str, object] = {}
    elif isinstance(value, str):
        items = [part for part in value.split(",") if part.strip()]
        bad = [part for part in items if "=" not in part]
        if bad:
            raise InputError(f"--{kind}: {bad[0]!r} is not KEY=VALUE (e.g. --{kind} {_EXAMPLE[kind]})")
        given = dict(part.split("=", 1) for part in items)
        given = {k.strip(): v for k, v in given.items()}
    elif isinstance(value, Mapping):
        given = dict(value)
    else:
        raise InputError(f"{kind} must be true, a table of settings or 'KEY=VALUE,...', got {value!r}")
    given = {ALIASES.get(k, k): v for k, v in given.items()}
    unknown = sorted(set(given) - set(DEFAULTS[kind]))
    if unknown:
        raise InputError(f"{kind} has no setting(s) {', '.join(unknown)}; it takes: {', '.join(DEFAULTS[kind])}")
    settings = {k: (_value(kind, k, given[k]) if k in given and given[k] is not None else v) for k, v in DEFAULTS[kind].items()}
    if kind == "mcd" and settings["where"] == "model" and "p" in given:
        raise InputError("mcd: where='model' uses the model's own dropout rates; p applies to where='head' only")
    return PassSpec(kind, tuple(settings.items()))


def require_pass(meta: Mapping, kind: str, who: str) -> dict:
    """The recorded settings of pass ``kind`` in a FeatureSet's meta, or an InputError saying how to get it."""
    got = (meta.get("passes") or {}).get(kind)
    if got is None:
        raise InputError(f"{who} needs the {kind} pass, which {meta.get('dataset', 'this FeatureSet')!r} does not hold: {option_hint(kind)}")
    return got


def fit_digests(train, layers: Sequence[str]) -> dict[str, str]:
    """Per layer, a hash of what its Gaussians are fitted on (the ID-train set's ``mds/<layer>`` and
    labels): recorded by the mds pass that perturbs along them, checked by the detector that scores
    with Gaussians fitted on its own ID-train set (``detectors.network``)."""
    return {n: hash_arrays({"features": train.extras[f"mds/{n}"], "labels": train.labels}) for n in layers}
