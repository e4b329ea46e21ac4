"""The CnC detector: the (K+1)-th class probability of a K+1-way model, as a higher = ID score.

CnC (Hebbalaguppe et al. 2022, arXiv:2207.13916) trains an extra class of synthetic outliers
(:mod:`oodeval.cnc`); a test sample is OOD when p(K+1) = softmax(f)_K is high. In the higher = ID
convention the score is

    form="prob"    : s = 1 - p(K+1)
    form="logodds" : s = log((1 - p(K+1)) / p(K+1)) = logsumexp(f_0..f_{K-1}) - f_K   (default)

The two are strictly decreasing in p(K+1) (and increasing in each other), so every ranking
metric (AUROC, TNR@TPR95, detection error) is identical. The release's test code
(``cnc-ood/cnc_ood``, ``test.py`` with ``utils/test_utils.py``: ``iterate_data_cnc``, then ``get_measures``, which
takes the ID scores as the positive, higher class) passes p(K+1) itself, i.e. ranks by the OOD
probability as if higher meant ID; ``1 - p(K+1)`` is the score that convention needs. The
log-odds form is computed without the float64 saturation of 1 - p near 0 (confident outliers
would otherwise tie at exactly 0).
It reads logits with K+1 columns; the outlier class is the last column unless ``outlier_class``
says otherwise (a FeatureSet whose ``meta["cnc"]`` is False, a plain model's, is refused). Not one
of the paper's 21 (``names("paper21")``); picked by default only for a FeatureSet that names its
outlier class (``meta["outlier_class"]``, as :func:`oodeval.cnc.train` writes it).
"""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

from ..errors import InputError
from ..features import FeatureSet
from ..params import Integral, Interval, Options
from . import register
from .base import Detector

__all__ = ["CnC"]


@register("cnc", tags=("logit", "cnc"))
class CnC(Detector):
    """s = 1 - p(K+1) (``form="prob"``) or its log-odds (``form="logodds"``, default)."""

    label = "CnC"

    needs = ("logits",)
    reads_outlier_class = True

    @classmethod
    def suits(cls, x: FeatureSet) -> bool:
        return x.meta.get("outlier_class") is not None

    constraints = {"form": Options("prob", "logodds"), "outlier_class": Interval(Integral, None, None)}

    def __init__(self, form: str = "logodds", outlier_class: int = -1) -> None:
        self.form = form
        self.outlier_class = outlier_class

    def _score(self, x: FeatureSet) -> np.ndarray:
        if x.meta.get("cnc") is False:
            raise InputError("cnc needs logits of a K+1 (CnC) model; this FeatureSet comes from a plain K-way model")
        f = np.asarray(x.logits, dtype=np.float64)
        c = f.shape[1]
        if c < 2:
            raise InputError(f"cnc needs K+1 >= 2 logit columns, got {c}")
        if not -c <= self.outlier_class < c:
            raise InputError(f"outlier_class {self.outlier_class} is outside the {c} logit columns")
        k = self.outlier_class % c
        rest = np.delete(f, k, axis=1)
        logodds = logsumexp(rest, axis=1) - f[:, k]
        if self.form == "logodds":
            return logodds
        # 1 - p = sigmoid(log-odds), evaluated stably
        return np.exp(-np.logaddexp(0.0, -logodds))
