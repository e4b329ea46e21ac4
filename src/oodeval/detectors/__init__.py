"""Registry of the post-hoc detectors: the paper's 21 (Sec. 2.1 / 4.1; the table in docs/detectors.md) and CnC's.

Each detector class registers itself with ``@register(name, tags=..., order=...)``
(:class:`oodeval.registry.Registry`); ``names()`` lists every registered detector in the paper's
order, ``names("paper21")`` the paper's 21, ``names("logit")`` one group; ``create(name,
**hyperparameters)`` builds one with the paper's defaults overridden by the given hyperparameters.
The defaults that depend on the backbone (NECO, ASH-S, NAC) come from
``defaults.resolve_defaults(name, featureset, overrides)``, which ``oodeval score`` and ``oodeval run`` apply.
"""

from __future__ import annotations

import importlib
import pkgutil

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


def canonical(name: str) -> str:
    """The registered name for ``name``: itself, or the detector a peer's name (OpenOOD's ``ebo``,
    pytorch-ood's ``EnergyBased``, :mod:`.peer_names`) stands for, which is logged."""
    return REGISTRY.canonical(name)


def create(name: str, **hyperparameters) -> Detector:
    """A new detector ``name`` with the paper's defaults, overridden by ``hyperparameters``."""
    return REGISTRY.create(name, **hyperparameters)


def supported(train: FeatureSet | None, test: FeatureSet, candidates: list[str] | None = None) -> list[str]:
    """The detectors among ``candidates`` (default: every registered one) whose needs the FeatureSets
    meet and that suit ``test`` (:meth:`Detector.suits`: ``cnc`` only on a K+1 model's features)."""
    out = []
    for name in names() if candidates is None else candidates:
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
