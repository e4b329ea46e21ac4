"""oodeval: exact, reproducible OOD-detection evaluation and OOD benchmark construction.

``oodeval.evaluate(...)`` and ``oodeval.extract_features(...)`` (:mod:`oodeval.api`) are the
one-call entry points; they are imported on first use so that ``import oodeval`` stays light.
"""

__version__ = "0.1.0"

__all__ = ["__version__", "evaluate", "extract_features"]


def __getattr__(name: str):
    if name in ("evaluate", "extract_features"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'oodeval' has no attribute {name!r}")
