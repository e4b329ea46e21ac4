"""Registry of the 21 post-hoc detectors (paper Sec. 2.1 / 4.1; DESIGN.md table).

``names()`` lists them in the paper's order; ``create(name, **hyperparameters)`` builds one with
the paper's defaults overridden by the given hyperparameters. The defaults that depend on the
backbone (NECO, ASH-S, NAC) come from ``defaults.resolve_defaults(name, featureset, overrides)``,
which ``oodeval score`` and ``oodeval run`` apply.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil

from ..features import FeatureSet
from .base import Detector

__all__ = ["Detector", "names", "create", "register", "supported", "REGISTRY"]

NAMES = (
    "msp", "maxlogit", "kl_matching", "energy", "gen",
    "react", "ash_s", "scale", "dice",
    "mahalanobis", "relative_mahalanobis", "mahalanobis_pp", "relative_mahalanobis_pp",
    "knn", "cosine", "mcm", "fdbd", "neco", "nac",
    "vim", "nnguide",
)  # fmt: skip

REGISTRY: dict[str, type[Detector]] = {}


def register(name: str):
    """Class decorator: make ``name`` creatable through :func:`create`."""

    def deco(cls: type[Detector]) -> type[Detector]:
        if name in REGISTRY and REGISTRY[name] is not cls:
            raise ValueError(f"detector {name!r} registered twice")
        REGISTRY[name] = cls
        cls.name = name
        return cls

    return deco


@functools.cache
def _load() -> None:
    """Import every detector module of this package once; each registers its classes with @register."""
    for info in pkgutil.iter_modules(__path__):
        if info.name != "base" and not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


def names() -> list[str]:
    """The 21 post-hoc detector names, in the paper's order."""
    return list(NAMES)


def create(name: str, **hyperparameters) -> Detector:
    """A new detector ``name`` with the paper's defaults, overridden by ``hyperparameters``."""
    _load()
    if name not in REGISTRY:
        raise KeyError(f"unknown detector {name!r}; known: {', '.join(sorted(REGISTRY))}")
    params = inspect.signature(REGISTRY[name]).parameters
    unknown = sorted(set(hyperparameters) - set(params))
    if unknown and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        raise ValueError(f"detector {name!r} has no hyperparameter(s) {', '.join(unknown)}; it takes: {', '.join(sorted(params)) or 'none'}")
    return REGISTRY[name](**hyperparameters)


def supported(train: FeatureSet | None, test: FeatureSet, candidates: list[str] | None = None) -> list[str]:
    """The detectors among ``candidates`` (default: all 21) whose needs the FeatureSets meet."""
    _load()
    out = []
    for name in names() if candidates is None else candidates:
        cls = REGISTRY[name]
        if cls.fit_needs and train is None:
            continue
        try:
            test.require(cls.needs)
            if cls.fit_needs:
                train.require(cls.fit_needs)
        except ValueError:
            continue
        out.append(name)
    return out
