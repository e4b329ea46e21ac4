"""Registry of the post-hoc detectors: the paper's 21 (Sec. 2.1 / 4.1; the table in docs/detectors.md) and CnC's.

Each detector class registers itself with ``@register(name, tags=..., order=...)``
(:class:`oodeval.registry.Registry`); ``names()`` lists every registered detector in the paper's
order, ``names("paper21")`` the paper's 21, ``names("logit")`` one group; ``create(name,
**hyperparameters)`` builds one with the paper's defaults overridden by the given hyperparameters.
The defaults that depend on the backbone are declared by each class
(:meth:`~oodeval.detectors.base.Detector.backbone_defaults`: NECO, ASH-S, NAC) and applied by
``defaults.resolve_defaults(name, featureset, overrides)``, through which every command builds a
detector (:func:`oodeval.scorer_factory.build_scorer`).
"""

from __future__ import annotations

import importlib
import pkgutil

from ..errors import InputError
from ..features import FeatureSet
from ..registry import Registry
from .base import Detector

__all__ = ["Detector", "names", "create", "canonical", "register", "supported", "REGISTRY"]


def _load() -> None:
    """Import every detector module of this package; each registers its classes with @register."""
    for info in pkgutil.iter_modules(__path__):
        if info.name != "base" and not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


REGISTRY = Registry("detector", "oodeval.detectors", load=_load)
register = REGISTRY.register


def names(*tags: str) -> list[str]:
    """Registered detector names carrying every tag in ``tags`` (all when none), in the paper's order."""
    return REGISTRY.names(*tags)


def default_names() -> list[str]:
    """The detectors a default selection draws from: every registered one except the ``module:Class``
    ones :func:`registry_name` registered (those run where they are named)."""
    return [n for n in REGISTRY.names() if "plugin" not in REGISTRY[n].tags]


def canonical(name: str) -> str:
    """The registered name for ``name``: itself, or the detector a peer's name (OpenOOD's ``ebo``,
    pytorch-ood's ``EnergyBased``, :mod:`.peer_names`) stands for, which is logged."""
    return REGISTRY.canonical(name)


def create(name: str, **hyperparameters) -> Detector:
    """A new detector ``name`` (a registered one, or ``module:Class``, :func:`registry_name`) with its
    defaults, overridden by ``hyperparameters``."""
    return REGISTRY.create(registry_name(name), **hyperparameters)


def registry_name(name: str) -> str:
    """``name`` as a registry name: a registered detector as it is; ``package.module:Class`` (a
    :class:`~oodeval.detectors.base.Detector` subclass importable from ``sys.path``) is imported and
    registered under that name (tag ``plugin``), so it works in every command like a built-in one
    (docs/extending.md). A class registered already keeps its registry name."""
    if ":" not in name or name in REGISTRY:
        return name
    module, _, attr = name.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        raise InputError(f"detector {name!r}: cannot import {module!r} ({exc}); put its folder on PYTHONPATH "
                         "(an experiment file's own folder is on it)") from exc
    except AttributeError:
        raise InputError(f"detector {name!r}: module {module!r} has no {attr!r}") from None
    if not (isinstance(cls, type) and issubclass(cls, Detector)):
        raise InputError(f"detector {name!r} is not a subclass of oodeval.detectors.base.Detector")
    known = next((n for n in REGISTRY.names() if REGISTRY[n] is cls), None)
    if known is not None:
        return known
    REGISTRY.register(name, tags=("plugin",))(cls)
    return name


def supported(train: FeatureSet | None, test: FeatureSet, candidates: list[str] | None = None) -> list[str]:
    """The detectors among ``candidates`` (default: every registered one) whose needs the FeatureSets
    meet and that suit ``test`` (:meth:`Detector.suits`: ``cnc`` only on a K+1 model's features)."""
    out = []
    for name in default_names() if candidates is None else candidates:
        cls = REGISTRY[name]
        if (cls.fit_needs and train is None) or not cls.suits(test):
            continue
        try:
            test.require(cls.needs)
            if cls.fit_needs:
                train.require(cls.fit_needs)
        except ValueError:
            continue
        out.append(name)
    return out
