"""oodeval: exact, reproducible OOD-detection evaluation and OOD benchmark construction.

``oodeval.evaluate(...)`` and ``oodeval.extract_features(...)`` (:mod:`oodeval.api`) are the one-call
entry points. Sub-modules load on first use (``import oodeval; oodeval.detectors.create("msp")``), so
that ``import oodeval`` itself stays light.
"""

import importlib
import pkgutil

__version__ = "0.1.0"

_API = ("evaluate", "extract_features")


def _submodules() -> set[str]:
    return {m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")}


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module(f"{__name__}.api"), name)
    if name in _submodules():
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _submodules() | set(_API))
