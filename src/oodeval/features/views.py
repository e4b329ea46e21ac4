"""Views of a FeatureSet that a detector may declare it reads: the K-way view of a K+1 (CnC) model.

A CnC model (:mod:`oodeval.cnc`) has K ID classes and one class of synthetic outliers, recorded
as ``meta["outlier_class"]``. Every detector except one that declares it reads that class
(:attr:`oodeval.detectors.base.Detector.reads_outlier_class`) sees the K-way classifier:
:func:`id_view`, the first K logits and head rows (docs/cnc.md).
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from .featureset import FeatureSet

__all__ = ["id_view", "num_id_classes"]


def num_id_classes(fs: FeatureSet) -> int:
    """K: ``meta["num_id_classes"]``, else the logit columns less the outlier class (when one is recorded)."""
    k = fs.meta.get("num_id_classes")
    if k is None:
        if fs.logits is None:
            raise InputError("FeatureSet has no logits and no meta['num_id_classes']")
        k = fs.logits.shape[1] - (1 if fs.meta.get("outlier_class") is not None else 0)
    return int(k)


def id_view(fs: FeatureSet) -> FeatureSet:
    """The K-way view of a CnC FeatureSet (drops the outlier logit and head row); others unchanged."""
    if fs.meta.get("outlier_class") is None:
        return fs
    k = num_id_classes(fs)
    return FeatureSet(
        features=fs.features,
        labels=fs.labels,
        logits=None if fs.logits is None else np.asarray(fs.logits)[:, :k],
        weight=None if fs.weight is None else np.asarray(fs.weight)[:k],
        bias=None if fs.bias is None else np.asarray(fs.bias)[:k],
        extras=fs.extras,
        meta=dict(fs.meta, outlier_class=None, view="first K logits"),
    )
