"""The one-call Python entry points: features from any model, and a whole evaluation as a DataFrame.

``extract_features(model, data, store)`` runs one cached, resumable forward pass (a model name or
any ``torch.nn.Module``) and returns the FeatureSet. ``evaluate(...)`` fits every requested
detector on ID-train features, scores the ID test set and each OOD set, and returns one tidy row
per (detector, OOD set) with every metric and its 95% bootstrap interval: the numbers
``oodeval score`` prints and writes, from the same functions.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ._extras import needs
from .errors import InputError
from .features import FeatureSet
from .evaluation import evaluate_detectors, failures

if TYPE_CHECKING:
    import pandas as pd
    from torch import nn

__all__ = ["extract_features", "evaluate"]



def extract_features(model: nn.Module | str, data: object, store: str | os.PathLike, **options) -> FeatureSet:
    """One forward pass of ``model`` over ``data`` into ``store``; returns the (memory-mapped) FeatureSet.

    ``model``: a timm / open_clip name, ``package.module:factory``, or an ``nn.Module`` (then
    ``transform=`` is required; ``classifier=`` / ``feature_layer=`` choose where features are read,
    see :mod:`oodeval.features.module`). ``data``: a manifest, registry name, image folder or CSV.
    ``options`` are those of :func:`oodeval.features.extract.extract` (``taps=True`` for NAC, ...).
    """
    with needs():
        from .features.extract import extract
    return FeatureSet.load(extract(model, data, store, **options))


def _features(data: object, what: str, model: object, store: str | os.PathLike | None, options: dict) -> FeatureSet:
    if isinstance(data, FeatureSet):
        return data
    if isinstance(data, (str, os.PathLike)) and (Path(data) / "meta.json").is_file():
        return FeatureSet.load(data)
    if model is None:
        raise InputError(f"{what}: {data!r} is not a FeatureSet folder; pass model= to extract it")
    if store is None:
        raise InputError(f"{what}: extracting {data!r} needs store= (the folder that caches features)")
    return extract_features(model, data, store, **options)


def evaluate(
    model: nn.Module | str | None = None,
    *,
    id: object,
    ood: Mapping[str, object],
    train: object,
    detectors: Sequence[str] | None = None,
    hyperparameters: Mapping[str, Mapping[str, object]] | None = None,
    store: str | os.PathLike | None = None,
    draws: int = 1000,
    seed: int = 0,
    fixed_id: bool = True,
    progress: bool = False,
    transform: Callable | None = None,
    errors: str = "raise",
    defaults: str | None = None,
    **extract_options,
) -> pd.DataFrame:
    """Fit ``detectors`` on ``train``, score ``id`` and every ``ood`` set; one row per (detector, OOD set).

    ``id``, ``train`` and each ``ood`` value: a FeatureSet, a FeatureSet folder, or data to extract
    with ``model`` into ``store`` (then ``transform`` etc. as in :func:`extract_features`).
    ``detectors``: names (default: every detector the features support); ``hyperparameters``:
    ``{"knn": {"k": 50}}``; ``defaults``: the detectors' defaults profile, ``"paper"`` (None: the
    paper's, a peer's name its peer's), ``"openood"`` or ``"pytorch-ood"`` (docs/detectors.md,
    defaults profiles). Columns: detector, ood, n_id, n_ood, fpr95 (the papers' FPR@95, ID
    positive), fpr95_ood_positive (OpenOOD's and pytorch-ood's, OOD positive; docs/detectors.md),
    tnr95, auroc, aupr_in, aupr_out, detection_error (fractions; higher score = ID) and ``<metric>_lo/_hi``
    95% percentile bootstrap bounds (``draws`` resamples, ``seed``; OOD resampled with the ID set
    fixed unless ``fixed_id=False``). Same numbers as ``oodeval score --draws D --seed S``.

    ``errors="raise"`` (default): a cell that fails (kNN's k above the training-set size, NaN
    features, ...) raises ValueError naming every failed (detector, OOD set) and why;
    ``errors="row"`` keeps such cells as rows with ``status == "error"``, NaN metrics and the
    message in ``error``, and warns once per failed cell. A hyperparameter of the wrong kind
    (``temperature="abc"``) or an unknown one raises before anything runs, either way.
    """
    import pandas as pd


    if not ood:
        raise InputError("evaluate needs at least one OOD set in ood={name: data}")
    if draws < 0:
        raise InputError(f"draws must be >= 0, got {draws}")
    if errors not in ("raise", "row"):
        raise InputError(f"errors must be 'raise' or 'row', got {errors!r}")
    options = dict(extract_options, transform=transform) if transform is not None else dict(extract_options)
    train_fs = _features(train, "train", model, store, options)
    id_fs = _features(id, "id", model, store, options)
    ood_fs = {name: _features(d, f"ood[{name!r}]", model, store, options) for name, d in ood.items()}
    rows = evaluate_detectors(train_fs, id_fs, ood_fs, list(detectors) if detectors else None, hyperparameters,
                              progress=progress, draws=draws, seed=seed, fixed_id=fixed_id, defaults=defaults)
    failed = failures(rows)
    if failed and errors == "raise":
        raise InputError(f"{len(failed)} of {len(rows)} (detector, OOD set) cells failed: " + "; ".join(failed)
                         + " (errors='row' keeps them as rows with status 'error')")
    for line in failed:
        warnings.warn(f"oodeval.evaluate: {line}", stacklevel=2)
    return pd.DataFrame(rows)
