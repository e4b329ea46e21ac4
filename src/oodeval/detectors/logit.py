"""Logit-based detectors: MSP, MaxLogit, KL-Matching, Energy, GEN (paper Sec. 2.1, group i).

All read only the logits f (N, C); scores are computed in float64 over row chunks.
"""

from __future__ import annotations

import numpy as np

from ..features import FeatureSet
from . import register
from ._common import as64, chunks, energy, log_softmax, max_softmax, onehot
from .base import Detector

__all__ = ["MSP", "MaxLogit", "KLMatching", "Energy", "GEN"]


def _per_chunk(x: FeatureSet, fn) -> np.ndarray:
    f = x.logits
    return np.concatenate([fn(as64(f[sl])) for sl in chunks(len(f), f.shape[1])])


def _temperature(t: float, who: str) -> float:
    if not (np.isfinite(t) and t > 0):
        raise ValueError(f"{who} temperature t must be a finite number > 0, got {t}")
    return float(t)


@register("msp")
class MSP(Detector):
    """Maximum softmax probability, s = max_c softmax(f / T)_c (Hendrycks & Gimpel, ICLR 2017).

    Default T = 1 (the paper's baseline); T > 1 is temperature scaling as in ODIN's first step
    (without its input perturbation). Computed as 1 / sum_c exp((f_c - max f) / T), which
    never overflows.
    """

    needs = ("logits",)

    def __init__(self, t: float = 1.0) -> None:
        self.t = t

    def _score(self, x: FeatureSet) -> np.ndarray:
        t = _temperature(self.t, "msp")
        return _per_chunk(x, max_softmax if t == 1 else lambda f: max_softmax(f / t))


@register("maxlogit")
class MaxLogit(Detector):
    """Maximum logit, s = max_c f_c (Hendrycks et al., "Scaling OOD detection", ICML 2022)."""

    needs = ("logits",)

    def _score(self, x: FeatureSet) -> np.ndarray:
        return _per_chunk(x, lambda f: f.max(axis=1))


@register("energy")
class Energy(Detector):
    """Energy score, s = T logsumexp(f / T) (Liu et al., NeurIPS 2020); default T = 1.

    Higher = ID (the negative free energy).
    """

    needs = ("logits",)

    def __init__(self, t: float = 1.0) -> None:
        self.t = t

    def _score(self, x: FeatureSet) -> np.ndarray:
        t = _temperature(self.t, "energy")
        return _per_chunk(x, lambda f: energy(f, t))


@register("gen")
class GEN(Detector):
    """Generalized entropy, s = -sum over the M largest p_c of p_c^g (1 - p_c)^g.

    Liu, Lochman & Zach, "GEN: Pushing the limits of softmax-based OOD detection", CVPR 2023.
    Defaults g = 0.1 and M = 100 (the paper's ImageNet setting; its release uses the same);
    M is capped at the number of classes.
    """

    needs = ("logits",)

    def __init__(self, gamma: float = 0.1, m: int = 100) -> None:
        self.gamma = gamma
        self.m = m

    def _score(self, x: FeatureSet) -> np.ndarray:
        if self.m < 1:
            raise ValueError(f"gen needs m >= 1, got {self.m}")
        g = self.gamma

        def fn(f: np.ndarray) -> np.ndarray:
            p = np.exp(log_softmax(f))
            m = min(int(self.m), p.shape[1])
            top = np.partition(p, p.shape[1] - m, axis=1)[:, p.shape[1] - m :]
            return -np.sum(top**g * (1.0 - top) ** g, axis=1)

        return _per_chunk(x, fn)


@register("kl_matching")
class KLMatching(Detector):
    """KL matching, s = -min_k KL(p || d_k) (Hendrycks et al., "Scaling OOD detection", ICML 2022).

    d_k is the mean softmax of the ID-train samples the model predicts as class k (argmax f);
    classes never predicted have no template and are skipped. KL uses natural logs with
    d_k clipped below at ``eps`` (default 1e-12) so log d_k stays finite; 0 log 0 = 0.
    KL(p || d) = sum p log p - p . log d, so all templates are matched with one matrix product.
    """

    needs = ("logits",)
    fit_needs = ("logits",)

    def __init__(self, eps: float = 1e-12) -> None:
        self.eps = eps

    def _fit(self, train: FeatureSet) -> None:
        f = train.logits
        c = f.shape[1]
        sums = np.zeros((c, c))
        counts = np.zeros(c)
        for sl in chunks(len(f), c):
            p = np.exp(log_softmax(f[sl]))
            k = p.argmax(axis=1)
            sums += onehot(k, np.arange(c)).T @ p
            counts += np.bincount(k, minlength=c)
        seen = counts > 0
        self.templates_ = sums[seen] / counts[seen, None]
        self.template_classes_ = np.flatnonzero(seen)
        self.log_templates_ = np.log(np.maximum(self.templates_, self.eps))

    def _score(self, x: FeatureSet) -> np.ndarray:
        def fn(f: np.ndarray) -> np.ndarray:
            logp = log_softmax(f)
            p = np.exp(logp)
            neg_entropy = np.sum(np.where(p > 0, p * logp, 0.0), axis=1)
            kl = neg_entropy[:, None] - p @ self.log_templates_.T
            return -kl.min(axis=1)

        return _per_chunk(x, fn)
