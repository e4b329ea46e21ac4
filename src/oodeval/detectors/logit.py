"""Logit-based detectors: MSP, MaxLogit, KL-Matching, Energy, GEN (paper Sec. 2.1, group i).

All read only the logits f (N, C), over row chunks. ``compute_dtype="float32"`` (default): exp and
products in float32, every sum over classes accumulated in float64; "float64": all in float64.
``device``: None = numpy, or a torch device (``_backend``).
float32 guarantees: every exp is of a shifted logit (error (|f_c - shift| + 4) eps of its term,
eps = 2^-24) and every sum is float64, so a score is within a few float32 ulps of its float64
value whatever the logits' offset or scale (tests/test_detectors_precision.py, docs/performance.md).
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from ..features import FeatureSet
from ..params import COMPUTE, POSITIVE, Instance, Integral, Interval
from . import REGISTRY, register
from ._backend import Compute
from ._peers import PeerMethod
from .base import Detector

__all__ = ["MSP", "MaxLogit", "KLMatching", "Energy", "GEN", "WeightedEnergy"]


def _over_rows(x: FeatureSet, fn, comp: Compute) -> np.ndarray:
    """fn(logit block on the backend) for every block of rows (split across cores, see
    :meth:`Compute.map_rows`), as float64."""
    return comp.map_rows(fn, x.logits, x.logits.shape[1])


@register("msp", tags=("paper21", "logit"), order=1)
class MSP(Detector):
    """Maximum softmax probability, s = max_c softmax(f / T)_c (Hendrycks & Gimpel, ICLR 2017).

    Default T = ``temperature`` = 1 (the paper's baseline); T > 1 is temperature scaling as in ODIN's first step
    (without its input perturbation). Computed as exp(f_y - s) / sum_c exp(f_c - s) on f / T,
    y the argmax, s a shift that keeps every exp finite (:meth:`Compute.max_softmax`): the
    numerator is the sum's own term, so a confident score keeps its distance to 1; ``compute_dtype``
    is that of the exp (the sum is float64 either way).
    """

    label = "MSP"

    needs = ("logits",)

    constraints = {"temperature": POSITIVE, **COMPUTE}

    def __init__(self, temperature: float = 1.0, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.temperature = temperature
        self.compute_dtype = compute_dtype
        self.device = device

    def _score(self, x: FeatureSet) -> np.ndarray:
        t = float(self.temperature)
        comp = self._compute()
        return _over_rows(x, lambda f: comp.max_softmax(f if t == 1 else f / t), comp)


@register("maxlogit", tags=("paper21", "logit"), order=2)
class MaxLogit(Detector):
    """Maximum logit, s = max_c f_c (Hendrycks et al., "Scaling OOD detection", ICML 2022).

    Read as f at its argmax (the same value, found faster; docs/performance.md, "Measurements moved
    out of docstrings").
    """

    label = "MaxLogit"

    needs = ("logits",)

    def _score(self, x: FeatureSet) -> np.ndarray:
        exact = Compute("float64" if x.logits.dtype == np.float64 else "float32")  # a max needs no wider type
        return _over_rows(x, lambda f: exact.pick(f, exact.argmax(f)), exact)


@register("energy", tags=("paper21", "logit"), order=4)
class Energy(Detector):
    """Energy score, s = T logsumexp(f / T) (Liu et al., NeurIPS 2020); default T = ``temperature`` = 1.

    Higher = ID (the negative free energy).
    """

    label = "Energy"

    needs = ("logits",)

    constraints = {"temperature": POSITIVE, **COMPUTE}

    def __init__(self, temperature: float = 1.0, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.temperature = temperature
        self.compute_dtype = compute_dtype
        self.device = device

    def _score(self, x: FeatureSet) -> np.ndarray:
        t = float(self.temperature)
        comp = self._compute()
        return _over_rows(x, lambda f: comp.logsumexp(f if t == 1 else f / t) * t, comp)


@register("gen", tags=("paper21", "logit"), order=5)
class GEN(Detector):
    """Generalized entropy, s = -sum over the M largest p_c of p_c^g (1 - p_c)^g.

    Liu, Lochman & Zach, "GEN: Pushing the limits of softmax-based OOD detection", CVPR 2023.
    Defaults g = ``gamma`` = 0.1 and M = ``top_m`` = 100 (the paper's ImageNet setting; its
    release uses the same); M is capped at the number of classes, and None takes every class
    (pytorch-ood's ``GEN`` default). The top M are found on the logits (softmax is
    monotone); their p_c and 1 - p_c are computed in float64 whatever ``compute_dtype``, so
    p_c close to 1 keeps its (1 - p_c)^g.
    """

    label = "GEN"

    needs = ("logits",)

    constraints = {"gamma": POSITIVE, "top_m": (Interval(Integral, 1, None), None), **COMPUTE}

    def __init__(self, gamma: float = 0.1, top_m: int | None = 100, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.gamma = gamma
        self.top_m = top_m
        self.compute_dtype = compute_dtype
        self.device = device

    def _score(self, x: FeatureSet) -> np.ndarray:
        g = self.gamma
        comp = self._compute()

        def fn(f: np.ndarray) -> np.ndarray:
            m = f.shape[1] if self.top_m is None else min(int(self.top_m), f.shape[1])
            log_top = comp.topk(f, m) - comp.logsumexp(f, own_max=True)[:, None]  # float64 log p of the top M
            if comp.device is not None:
                return -((g * log_top).exp() * (-log_top.expm1()) ** g).sum(dim=1)
            return -np.sum(np.exp(g * log_top) * (-np.expm1(log_top)) ** g, axis=1)

        return _over_rows(x, fn, comp)


@register("kl_matching", tags=("paper21", "logit"), order=3)
class KLMatching(Detector):
    """KL matching, s = -min_k KL(p || d_k) (Hendrycks et al., "Scaling OOD detection", ICML 2022).

    d_k is the mean softmax of the ID-train samples the model predicts as class k (argmax f);
    classes never predicted have no template and are skipped. KL uses natural logs with
    d_k clipped below at ``eps`` (default 1e-12) so log d_k stays finite; 0 log 0 = 0.
    KL(p || d) = sum p log p - p . log d, so all templates are matched with one matrix product.
    """

    label = "KL-Match."

    needs = ("logits",)
    fit_needs = ("logits",)

    constraints = {"eps": POSITIVE, **COMPUTE}

    def __init__(self, eps: float = 1e-12, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.eps = eps
        self.compute_dtype = compute_dtype
        self.device = device

    def _fit(self, train: FeatureSet) -> None:
        f = train.logits
        c = f.shape[1]
        comp = self._compute()
        sums = comp.zeros((c, c))
        counts = np.zeros(c)
        chunks = list(comp.chunks(len(f), c))
        buf = comp.empty((chunks[0].stop - chunks[0].start, c))  # e of each chunk, written in place
        for sl in chunks:
            e = buf[: sl.stop - sl.start]
            total, k = comp.by_rows(lambda a, o: (comp.shifted_exp(a, o)[2], comp.argmax(a)), comp.put(f[sl]), e)
            k, total = comp.host(k), comp.get(total)
            sums += comp.groupsum(e, k, c, weights=1.0 / total)  # softmax p = e / total
            counts += np.bincount(k, minlength=c)
        sums = comp.get(sums)
        seen = counts > 0
        self.templates_ = sums[seen] / counts[seen, None]
        self.template_classes_ = np.flatnonzero(seen)
        self.log_templates_ = np.log(np.maximum(self.templates_, self.eps))

    def _score(self, x: FeatureSet) -> np.ndarray:
        comp = self._compute()
        log_t = comp.put(self.log_templates_.T)

        # -min_k (sum p log p - p . log d_k) = max_k (p . log d_k) - sum p log p: float64 rounding
        # is monotone in the subtrahend, so this is the same value without a (rows, K) float64
        # matrix. With e = exp(f - max f) and p = e / total: p . log d_k = (e . log d_k) / total and
        # sum p log p = (e . (f - max f)) / total - log total, so p itself is never formed.
        def softmax_terms(a):
            shifted = a - comp.rowmax(a)[:, None]
            e = comp.exp(shifted)
            total = comp.rowsum(e)
            return e, total, comp.rowdot(e, shifted) / total - comp.log(total)

        def block(a):
            e, total, neg_entropy = softmax_terms(a)
            return comp.rowmax(e @ log_t) / total - neg_entropy

        return _over_rows(x, block, comp)


@register("webo", tags=("logit", "since-paper"))
class WeightedEnergy(PeerMethod):
    """Weighted energy (WEBO), s = log sum_c relu(w_c) exp(f_c) (higher = ID).

    Du, Wang, Cai & Li, "VOS: Learning what you don't know by virtual outlier synthesis", ICLR
    2022; pytorch-ood 0.4.0's ``WeightedEBO`` (``pytorch_ood/detector/webo.py``: the negated
    log of the weighted sum of exp f_c, negative weights clipped to 0 by a ReLU). ``class_weights``
    w (C values) are learned in training (VOS's ``Linear(C, 1).weight``, e.g. pytorch-ood's
    ``VOSRegLoss``); None (default) = every w_c = 1, which is :class:`Energy` (T = 1) exactly.
    Computed as logsumexp(f + log w) over the classes with w_c > 0 (the exp shifted, so it never
    overflows, where the release's plain exp does for logits above ~88 in float32); ``compute_dtype``
    and ``device`` as in :class:`Energy`.
    """

    label = "WEBO"

    needs = ("logits",)

    constraints = {"class_weights": (Instance(list, tuple), None), **COMPUTE}

    def __init__(self, class_weights: list[float] | tuple[float, ...] | None = None, compute_dtype: str = "float32",
                 device: str | None = None) -> None:  # fmt: skip
        self.class_weights = class_weights
        self.compute_dtype = compute_dtype
        self.device = device

    def _log_weights(self, c: int) -> np.ndarray | None:
        """log relu(w) as float64 (C,) (-inf where w <= 0), or None for uniform weights."""
        if self.class_weights is None:
            return None
        w = np.asarray(self.class_weights, dtype=np.float64).reshape(-1)
        if w.shape != (c,) or not np.isfinite(w).all():
            raise InputError(f"detector 'webo': class_weights must be {c} finite numbers (one per class), got {w.size}"
                             + ("" if np.isfinite(w).all() else " with a non-finite one"))  # fmt: skip
        if not (w > 0).any():
            raise InputError("detector 'webo': every class weight is <= 0, so relu(w) = 0 leaves no class to score")
        with np.errstate(divide="ignore"):
            return np.log(np.maximum(w, 0.0))

    def _score(self, x: FeatureSet) -> np.ndarray:
        comp = self._compute()
        log_w = self._log_weights(x.logits.shape[1])
        if log_w is None:
            return _over_rows(x, lambda f: comp.logsumexp(f), comp)
        shift = comp.put(log_w)
        return _over_rows(x, lambda f: comp.logsumexp(f + shift, overwrite=True), comp)


REGISTRY.alias("WeightedEBO", "webo", "pytorch-ood 0.4", tags=("pytorch-ood",))
