"""Which optional part of oodeval (a ``pip install 'oodeval[EXTRA]'`` extra, pyproject.toml) a
missing package belongs to, so that the error asking for it names the fix.

The core (numpy, scipy, scikit-learn, pandas) scores arrays and FeatureSets; networks, figures
and Parquet tables are extras. :func:`missing_extra` turns an ImportError into that message; the
CLI prints it as ``oodeval CMD: error: ...`` (exit 2) and :func:`needs` re-raises it for Python calls.

Where the heavy packages load: a module that cannot work without one (a network, a training loop)
imports it at module level and is itself imported only where that work starts; a module of the
light core that touches one on one path only (a device name, a model-name check, a job
submitter) asks :func:`optional` for it there, the one lazy import of every such package.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

__all__ = ["EXTRAS", "missing_extra", "needs", "optional"]

#: top-level module -> (package to install, extra that brings it)
EXTRAS = {
    "torch": ("torch", "models"),
    "torchvision": ("torchvision", "models"),
    "timm": ("timm", "models"),
    "safetensors": ("safetensors", "models"),
    "PIL": ("pillow", "models"),
    "open_clip": ("open_clip_torch", "vlm"),
    "transformers": ("transformers", "vlm"),
    "matplotlib": ("matplotlib", "report"),
    "pyarrow": ("pyarrow", "results"),
    "skimage": ("scikit-image", "cnc"),
    "imagecorruptions": ("imagecorruptions", "frost"),
    "submitit": ("submitit", "distributed"),
    "ray": ("ray", "distributed"),
    "scikit_posthocs": ("scikit-posthocs", "rank"),
    "statsmodels": ("scikit-posthocs", "rank"),
    "seaborn": ("scikit-posthocs", "rank"),
}


def missing_extra(exc: BaseException) -> str | None:
    """``"... needs torch: pip install 'oodeval[models]' ..."`` when ``exc`` is an ImportError for a
    package of an extra (pandas' "Missing optional dependency 'pyarrow'" included); else None."""
    if not isinstance(exc, ImportError):
        return None
    root = (getattr(exc, "name", None) or "").split(".")[0]
    if root not in EXTRAS:
        root = next((m for m in EXTRAS if f"'{m}'" in str(exc)), "")
    if root not in EXTRAS:
        return None
    package, extra = EXTRAS[root]
    cpu = " (CPU-only torch: pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu)" if extra in ("models", "vlm", "cnc") else ""
    return f"this needs {package}, which the core install leaves out: pip install 'oodeval[{extra}]'{cpu}"


@contextmanager
def needs() -> Iterator[None]:
    """Re-raise an ImportError of an extra's package as ModuleNotFoundError naming the extra."""
    try:
        yield
    except ImportError as exc:
        message = missing_extra(exc)
        if message is None:
            raise
        raise ModuleNotFoundError(message, name=getattr(exc, "name", None)) from exc


def optional(name: str) -> ModuleType:
    """The module ``name`` of an extra's package (``"torch"``, ``"timm.models"``), imported on first
    use; missing, a ModuleNotFoundError naming the extra that brings it (:func:`needs`)."""
    if name.split(".")[0] not in EXTRAS:
        raise KeyError(f"{name!r} is not a package of an extra; EXTRAS lists them")
    with needs():
        return importlib.import_module(name)
