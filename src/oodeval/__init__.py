"""oodeval: exact, reproducible OOD-detection evaluation and OOD benchmark construction.

Sub-modules load on first use (``import oodeval; oodeval.detectors.create("msp")``), so that
``import oodeval`` itself stays light.
"""

import importlib
import pkgutil

__version__ = "0.1.0"


def _submodules() -> set[str]:
    return {m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")}


def __getattr__(name: str):
    if name in _submodules():
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _submodules())
