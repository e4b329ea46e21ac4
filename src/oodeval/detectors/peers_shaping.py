"""The peers' activation-shaping and last-layer-gradient detectors: ASH-B, ASH-P, VRA, LTS,
GradNorm, GradUncertainty (OpenOOD v1.5, pytorch-ood 0.4).

The shapings act on the pooled penultimate feature z (N, D), as OpenOOD applies ASH and VRA,
and read out the energy logsumexp(W z' + b) through the head (``compute_dtype`` as in
:mod:`oodeval.detectors.activation`). The gradient methods have a closed form: the gradient of
a loss L(f) of the logits f = W z + b with respect to the head's weight is g z^T, g = dL/df, so
its norms factor into a norm of g times a norm of z (and of 1 for the bias). Scores are float64,
higher = more in-distribution; docs/detectors.md ("The peers' methods") lists the differences.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from ..features import FeatureSet
from ..params import BOOLEAN, COMPUTE, POSITIVE, Interval, Real
from . import register
from ._common import as64, chunked_percentile, chunks, logsumexp_rows
from .activation import _energy_of, _keep, _sum64, _top_k
from ._peers import PeerMethod

__all__ = ["ASHB", "ASHP", "VRA", "LTS", "GradNorm", "GradUncertainty", "ash_b_features", "ash_p_features"]


def ash_p_features(z: np.ndarray, percentile: float) -> np.ndarray:
    """ASH-P: all but the top k = D - round(D p / 100) entries of each row set to 0."""
    return _top_k(z, _keep(z.shape[1], percentile))


def ash_b_features(z: np.ndarray, percentile: float) -> np.ndarray:
    """ASH-B: the top k entries of each row set to s1 / k (s1 = the row's sum), the rest to 0."""
    d = z.shape[1]
    k = _keep(d, percentile)
    top = np.argpartition(z, d - k, axis=1)[:, d - k :]
    out = np.zeros_like(z)
    fill = (_sum64(z) / k).astype(z.dtype)
    np.put_along_axis(out, top, np.broadcast_to(fill[:, None], top.shape), axis=1)
    return out


@register("ash_b", tags=("activation",))
class ASHB(PeerMethod):
    """ASH-B: binarised top (100 - p)% of z, each kept entry s1 / k, energy readout.

    Djurisic et al., "Extremely simple activation shaping for OOD detection", ICLR 2023.
    Default p = 65, the paper's ImageNet ResNet-50 setting ("ASH-B@65"); OpenOOD's ``ash``
    postprocessor is ASH-B with p = 90 (``ash.yml``), pytorch-ood's ``ASH(variant="ash-b")``
    takes p as a fraction (default 0.65). Ties at the k-th value are broken arbitrarily, as by
    the releases' ``topk``.
    """

    needs = ("features", "head")

    constraints = {"percentile": Interval(Real, 0, 100, closed="left"), **COMPUTE}

    def __init__(self, percentile: float = 65.0, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.percentile = percentile
        self.compute_dtype = compute_dtype
        self.device = device

    def _score(self, x: FeatureSet) -> np.ndarray:
        return _energy_of(self._compute(), x, lambda z: ash_b_features(z, self.percentile), x.weight, x.bias)


@register("ash_p", tags=("activation",))
class ASHP(PeerMethod):
    """ASH-P: the top (100 - p)% entries of z kept, the rest 0 (no rescaling), energy readout.

    Djurisic et al., ICLR 2023; default p = 90, the paper's ImageNet ResNet-50 setting
    ("ASH-P@90"); pytorch-ood's ``ASH(variant="ash-p")`` defaults to 0.65.
    """

    needs = ("features", "head")

    constraints = {"percentile": Interval(Real, 0, 100, closed="left"), **COMPUTE}

    def __init__(self, percentile: float = 90.0, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.percentile = percentile
        self.compute_dtype = compute_dtype
        self.device = device

    def _score(self, x: FeatureSet) -> np.ndarray:
        return _energy_of(self._compute(), x, lambda z: ash_p_features(z, self.percentile), x.weight, x.bias)


def _column_percentiles(z: np.ndarray, q: float, block: int = 64) -> np.ndarray:
    """np.percentile(z, q, axis=0) (linear interpolation), float64, a block of columns at a time."""
    return np.concatenate([np.percentile(as64(z[:, c : c + block]), q, axis=0) for c in range(0, z.shape[1], block)])


@register("vra", tags=("activation",))
class VRA(PeerMethod):
    """VRA as its releases run it: z clipped to [lo, hi], energy readout (Xu et al., NeurIPS 2023).

    lo, hi = the ``low``-th and ``high``-th percentiles of the ID-train features: over all their
    entries (default, OpenOOD's, with its defaults 10 and 90), or per feature dimension with
    ``per_dim`` (pytorch-ood's, with its defaults 1 and 99). The paper's VRA-P also zeroes
    entries below lo and adds an offset to those kept; neither release does, nor does this.
    """

    needs = ("features", "head")
    fit_needs = ("features",)

    constraints = {"low": Interval(Real, 0, 100), "high": Interval(Real, 0, 100), "per_dim": BOOLEAN, **COMPUTE}

    def __init__(self, low: float = 10.0, high: float = 90.0, per_dim: bool = False, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.low = low
        self.high = high
        self.per_dim = per_dim
        self.compute_dtype = compute_dtype
        self.device = device

    def _fit(self, train: FeatureSet) -> None:
        if not self.low <= self.high:
            raise InputError(f"detector 'vra': low={self.low} must not exceed high={self.high}")
        z = train.features
        if self.per_dim:
            self.lower_, self.upper_ = _column_percentiles(z, self.low), _column_percentiles(z, self.high)
        else:
            self.lower_, self.upper_ = chunked_percentile(z, self.low), chunked_percentile(z, self.high)

    def _score(self, x: FeatureSet) -> np.ndarray:
        def clip(z):
            lo = np.asarray(self.lower_, dtype=z.dtype)
            return np.clip(z, lo, np.asarray(self.upper_, dtype=z.dtype))

        return _energy_of(self._compute(), x, clip, x.weight, x.bias)


@register("lts", tags=("activation",))
class LTS(PeerMethod):
    """Logit scaling: s = logsumexp(S f), S = (sum relu(z) / sum of the top k of relu(z))^2.

    Djurisic et al., "Logit scaling for out-of-distribution detection" (pytorch-ood's ``LTS``);
    k = max(1, D - round(D (1 - p))), default p = 0.05 (the top 5%), as that release; f the
    cached logits. A row whose top-k sum is 0 is not rescaled (S = 1).
    """

    needs = ("features", "logits")

    constraints = {"p": Interval(Real, 0, 1, closed="right")}

    def __init__(self, p: float = 0.05) -> None:
        self.p = p

    def _score(self, x: FeatureSet) -> np.ndarray:
        out = np.empty(len(x))
        for sl in chunks(len(x), x.features.shape[1]):
            z = np.maximum(as64(x.features[sl]), 0.0)
            d = z.shape[1]
            k = max(1, d - int(round(d * (1 - self.p))))
            s2 = np.partition(z, d - k, axis=1)[:, d - k :].sum(1)
            s = np.square(np.divide(z.sum(1), s2, out=np.ones(len(z)), where=s2 > 0))
            out[sl] = logsumexp_rows(as64(x.logits[sl]) * s[:, None])
        return out


def _softmax64(f: np.ndarray, t: float = 1.0) -> np.ndarray:
    f = as64(f) / t
    e = np.exp(f - f.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


@register("gradnorm", tags=("hybrid",))
class GradNorm(PeerMethod):
    """GradNorm: s = || dL/dW ||_1 = ||softmax(f / T) - 1/C||_1 ||z||_1 / T, W the head's weight.

    Huang, Geng & Li, "On the importance of gradients for detecting distributional shifts in
    the wild", NeurIPS 2021. L = (1/C) sum_c -log softmax(f / T)_c, the cross-entropy to the
    uniform distribution (KL(u || p) up to a constant); dL/df = (softmax(f / T) - 1/C) / T and
    dL/dW = (dL/df) z^T, whose entrywise l1 norm factors. The releases (the paper's, OpenOOD's)
    read only the last layer's weight, so this is exact on cached features; T = 1 as they do.
    Their loss sums over classes (targets all ones), C times this one: the same ranking.
    """

    needs = ("features", "logits")

    constraints = {"temperature": POSITIVE}

    def __init__(self, temperature: float = 1.0) -> None:
        self.temperature = temperature

    def _score(self, x: FeatureSet) -> np.ndarray:
        t = float(self.temperature)
        out = np.empty(len(x))
        for sl in chunks(len(x), max(x.features.shape[1], x.logits.shape[1])):
            p = _softmax64(x.logits[sl], t)
            out[sl] = np.abs(p - 1.0 / p.shape[1]).sum(1) * np.abs(as64(x.features[sl])).sum(1) / t
        return out


@register("grad_uncertainty", tags=("hybrid",))
class GradUncertainty(PeerMethod):
    """Gradient uncertainty on the head: s = ||C p - 1||^2 (||z||^2 + 1), p = softmax(f).

    Oberdiek, Rottmann & Gottschalk, "Classification uncertainty of deep neural networks based on
    gradient information", ANNPR 2018 (pytorch-ood's ``GradUncertainty``): the squared l2 norms
    of the gradients of L = BCE(p, 1) = -sum_c log p_c with respect to the head's weight and
    bias (dL/df = C p - 1), summed. pytorch-ood sums over the parameters it is given; with only
    the linear head this is its score, except that torch's BCE backward divides by max(p (1 - p),
    1e-12), which bends its gradient on rows with a class of p (1 - p) < 1e-12 (confident ones).
    """

    needs = ("features", "logits")

    def _score(self, x: FeatureSet) -> np.ndarray:
        out = np.empty(len(x))
        for sl in chunks(len(x), max(x.features.shape[1], x.logits.shape[1])):
            p = _softmax64(x.logits[sl])
            g = np.square(p.shape[1] * p - 1).sum(1)
            out[sl] = g * (np.square(as64(x.features[sl])).sum(1) + 1)
        return out
