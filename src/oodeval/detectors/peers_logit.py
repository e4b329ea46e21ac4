"""The peers' logit detectors: Entropy, temperature scaling, OpenMax (OpenOOD v1.5, pytorch-ood 0.4).

Each reads the logits f (N, C) (and, for OpenMax's fit, the ID-train labels). Softmax sums are
float64 whatever ``compute_dtype`` (the exp of shifted logits in that dtype, as in
:mod:`oodeval.detectors.logit`); scores are float64, higher = more in-distribution. Where the
peers differ from each other or from the paper, docs/detectors.md ("The peers' methods") says how.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import logsumexp
from scipy.stats import weibull_min

from .._extras import optional
from ..errors import InputError
from ..features import FeatureSet
from ..params import BOOLEAN, COMPUTE, SEED, Integral, Interval, Options, Real
from . import register
from ._backend import Compute
from ._common import as64, chunks, labelled
from ._peers import PeerMethod
from .logit import MSP

__all__ = ["Entropy", "TemperatureScaling", "OpenMax", "neg_entropy", "fit_temperature", "fit_temperature_lbfgs", "FITS", "WEIBULL_TRANSLATION"]

#: libmr's FitHigh shifts the tail by this amount minus its smallest value before the Weibull
#: fit (both peers keep it); it changes the fitted CDF only slightly and is kept for agreement
WEIBULL_TRANSLATION = 10_000.0


def neg_entropy(comp: Compute, f) -> np.ndarray:
    """sum_c p_c log p_c of softmax(f) per row, float64: with e = exp(f - max f) and S = sum e,
    it is (e . (f - max f)) / S - log S, so p and log p are never formed (no log 0)."""
    shifted = f - comp.rowmax(f)[:, None]
    e = comp.exp(shifted)
    total = comp.rowsum(e)
    log_total = comp.log(total)
    return comp.rowdot(e, shifted) / total - log_total


@register("entropy", tags=("logit",))
class Entropy(PeerMethod):
    """Negative softmax entropy, s = sum_c p_c log p_c, p = softmax(f) (higher = ID).

    Chan, Rottmann & Gottschalk, "Entropy maximization and meta classification for OOD detection
    in semantic segmentation", ICCV 2021 (pytorch-ood's ``Entropy``). No hyperparameters.
    pytorch-ood clips p to [1e-7, 1] before the log; this computes the exact entropy (0 log 0 = 0).
    """

    needs = ("logits",)

    constraints = COMPUTE

    def __init__(self, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.compute_dtype = compute_dtype
        self.device = device

    def _score(self, x: FeatureSet) -> np.ndarray:
        comp = self._compute()
        return comp.map_rows(lambda f: neg_entropy(comp, f), x.logits, x.logits.shape[1])


def fit_temperature(logits: np.ndarray, labels: np.ndarray, bounds: tuple[float, float] = (1e-3, 1e3)) -> float:
    """T minimising the mean negative log-likelihood of ``labels`` under softmax(f / T), float64.

    The NLL is convex in 1 / T (a log-sum-exp of a linear function minus a linear term), so it has
    one minimum; it is found by bounded Brent search over log T in ``bounds`` (a minimum on the
    boundary means the logits carry no usable calibration, e.g. all predictions right: T -> 0).
    """
    f = as64(logits)
    y = np.asarray(labels)
    picked = f[np.arange(len(f)), y]

    def nll(log_t: float) -> float:
        b = np.exp(-log_t)
        return float(np.mean(logsumexp(f * b, axis=1) - picked * b))

    lo, hi = np.log(bounds[0]), np.log(bounds[1])
    res = minimize_scalar(nll, bounds=(lo, hi), method="bounded", options={"xatol": 1e-10})
    return float(np.exp(res.x))


#: temperature fits: "exact" (:func:`fit_temperature`), or a release's L-BFGS from its start T
FITS = {"exact": None, "openood": 1.5, "pytorch-ood": 1.0}


def fit_temperature_lbfgs(logits: np.ndarray, labels: np.ndarray, start: float, lr: float = 0.01, steps: int = 50) -> float:
    """T after the releases' fit: torch's L-BFGS (``lr``, ``max_iter=steps``, no line search) on
    the mean NLL of softmax(f / T) in float32, from T = ``start`` (OpenOOD v1.5
    ``temp_scaling_postprocessor.py``: 1.5; pytorch-ood 0.4 ``TemperatureScaling.fit_logits``: 1)."""
    torch = optional("torch")
    f = torch.as_tensor(np.asarray(logits, dtype=np.float32))
    y = torch.as_tensor(np.asarray(labels, dtype=np.int64))
    t = torch.nn.Parameter(torch.tensor(float(start)))
    optimizer = torch.optim.LBFGS([t], lr=lr, max_iter=steps)

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(f / t, y)
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(closure)
    return float(t.detach())


@register("temperature_scaling", tags=("logit",))
class TemperatureScaling(PeerMethod):
    """MSP after temperature scaling: s = max_c softmax(f / T)_c, T fitted to minimise the NLL.

    Guo et al., "On calibration of modern neural networks", ICML 2017. T minimises the mean
    negative log-likelihood of the labels on a validation split (:func:`fit_temperature`, the
    exact minimiser). The split: a seeded random ``val_fraction`` (default 0.1, ``seed`` 0) of the
    labelled rows of the set ``fit`` is given (the ID-train set in ``oodeval score``/``run``);
    ``val_fraction=1`` uses all of them, e.g. when that set already is a held-out validation set
    (OpenOOD fits on its ID ``val`` split). Both releases run L-BFGS (lr 0.01, 50 steps; OpenOOD
    starts at T = 1.5, pytorch-ood at 1), which need not reach the minimum: ``procedure="openood"`` /
    ``"pytorch-ood"`` runs that procedure (:func:`fit_temperature_lbfgs`, torch's L-BFGS in
    float32; their defaults profiles, with ``val_fraction=1``), ``procedure="exact"`` (default) the
    exact minimiser. The fitted T is recorded in ``resolved_params()``; the score is
    :class:`~oodeval.detectors.logit.MSP`'s.
    """

    needs = ("logits",)
    fit_needs = ("logits", "labels")

    constraints = {"val_fraction": Interval(Real, 0, 1, closed="right"), "seed": SEED, "procedure": Options(*FITS), **COMPUTE}

    def __init__(self, val_fraction: float = 0.1, seed: int = 0, compute_dtype: str = "float32", device: str | None = None,
                 procedure: str = "exact") -> None:  # fmt: skip
        self.val_fraction = val_fraction
        self.seed = seed
        self.compute_dtype = compute_dtype
        self.device = device
        self.procedure = procedure

    def _fit(self, train: FeatureSet) -> None:
        idx, _ = labelled(train.labels, "temperature_scaling")
        n = max(1, int(round(self.val_fraction * idx.size)))
        if n < idx.size:
            idx = np.sort(np.random.default_rng(self.seed).choice(idx, size=n, replace=False))
        self.val_rows_ = idx
        logits, labels = train.logits[idx], np.asarray(train.labels)[idx]
        if self.procedure == "exact":
            self.temperature_ = fit_temperature(logits, labels)
        else:
            self.temperature_ = fit_temperature_lbfgs(logits, labels, FITS[self.procedure])
        self.resolved_ = {"temperature": self.temperature_}

    def _score(self, x: FeatureSet) -> np.ndarray:
        return MSP(temperature=self.temperature_, compute_dtype=self.compute_dtype, device=self.device).fit()._score(x)


def _distances(f: np.ndarray, means: np.ndarray, kind: str, eu_weight: float) -> np.ndarray:
    """(N, K) distances of logit rows to the class means (MAVs), float64: "euclidean", "cosine"
    (1 - cos) or "eucos" (eu_weight * euclidean + cosine, the OSDN release's combination)."""
    f = as64(f)
    eu = np.sqrt(np.maximum((f**2).sum(1)[:, None] - 2 * f @ means.T + (means**2).sum(1)[None, :], 0.0))
    if kind == "euclidean":
        return eu
    norms = np.linalg.norm(f, axis=1)[:, None] * np.linalg.norm(means, axis=1)[None, :]
    cos = 1.0 - np.divide(f @ means.T, norms, out=np.zeros((len(f), len(means))), where=norms > 0)
    return cos if kind == "cosine" else eu_weight * eu + cos


@register("openmax", tags=("logit",))
class OpenMax(PeerMethod):
    """OpenMax: Weibull-recalibrated logits with an "unknown" class (Bendale & Boult, CVPR 2016).

    Fit: per class k, the mean logit vector (MAV) m_k of the ID-train rows labelled k (and, with
    ``correct_only``, predicted k) and a Weibull fit of the ``tailsize`` largest distances
    d(f, m_k) of those rows, libmr-style: the tail is shifted by 10000 - its minimum and a
    two-parameter Weibull (location 0) is fitted by maximum likelihood (``scipy.stats.weibull_min``,
    no native libmr). Score: the ``alpha`` top classes of f get weights w_r = (alpha + 1 - r) /
    alpha (rank r = 1..alpha), every other class 0; with c_k = WeibullCDF_k(d(f, m_k)), v_k =
    f_k (1 - w_k c_k) and v_0 = sum_k f_k w_k c_k; P = softmax(v_0, v_1..v_K). ``readout``
    "unknown" (default): s = -log P_0 (the score of both releases, -P_0: OpenOOD v1.5
    ``openmax_postprocessor.py`` returns conf = -P(unknown), pytorch-ood P(unknown) as its outlier
    score; here in the log domain, so it keeps its resolution where P_0 is tiny); "max": s = log
    max_j P_j over all K + 1 entries (neither release's; it counts a confident "unknown" as ID).
    Defaults are OpenOOD v1.5's: tailsize 20,
    alpha 3, Euclidean distance, correctly classified rows only (the paper's release: tail 20,
    alpha 10, "eucos" with eu_weight 1/200; pytorch-ood: tail 25, alpha 10, Euclidean, all
    labelled rows). A class whose fit set is empty has no model and gets c_k = 1.
    """

    needs = ("logits",)
    fit_needs = ("logits", "labels")

    constraints = {"tailsize": Interval(Integral, 2, None), "alpha": Interval(Integral, 1, None), "distance": Options("euclidean", "cosine", "eucos"), "eu_weight": Interval(Real, 0, None), "correct_only": BOOLEAN, "readout": Options("unknown", "max")}

    def __init__(
        self,
        tailsize: int = 20,
        alpha: int = 3,
        distance: str = "euclidean",
        eu_weight: float = 0.005,
        correct_only: bool = True,
        readout: str = "unknown",
    ) -> None:
        self.tailsize = tailsize
        self.alpha = alpha
        self.distance = distance
        self.eu_weight = eu_weight
        self.correct_only = correct_only
        self.readout = readout

    def _fit(self, train: FeatureSet) -> None:
        f, y = as64(train.logits), np.asarray(train.labels)
        c = f.shape[1]
        keep = (y >= 0) & (f.argmax(1) == y) if self.correct_only else y >= 0
        self.means_ = np.zeros((c, c))
        self.weibull_ = np.full((c, 3), np.nan)  # shape, scale, shift per class
        for k in range(c):
            rows = f[keep & (y == k)]
            if len(rows) == 0:
                continue
            self.means_[k] = rows.mean(0)
            tail = np.sort(_distances(rows, self.means_[k : k + 1], self.distance, self.eu_weight)[:, 0])[-int(self.tailsize) :]
            shift = WEIBULL_TRANSLATION - tail.min()
            if np.ptp(tail) == 0:  # a degenerate tail: every distance at or below it is "inside"
                self.weibull_[k] = (np.inf, tail[0] + shift, shift)
                continue
            shape, _, scale = weibull_min.fit(tail + shift, floc=0)
            self.weibull_[k] = (shape, scale, shift)
        if np.isnan(self.weibull_[:, 0]).all():
            raise InputError("openmax found no (correctly classified) labelled ID-train rows to fit")

    def _cdf(self, d: np.ndarray) -> np.ndarray:
        shape, scale, shift = self.weibull_.T
        with np.errstate(over="ignore", invalid="ignore"):
            cdf = -np.expm1(-(((d + shift) / scale) ** shape))
        cdf = np.where(np.isinf(shape), ((d + shift) > scale).astype(float), cdf)
        return np.where(np.isnan(shape), 1.0, cdf)

    def _score(self, x: FeatureSet) -> np.ndarray:
        alpha = min(int(self.alpha), x.logits.shape[1])
        out = np.empty(len(x))
        ranks = (alpha + 1 - np.arange(1, alpha + 1)) / alpha
        for sl in chunks(len(x), x.logits.shape[1]):
            f = as64(x.logits[sl])
            top = np.argsort(-f, axis=1, kind="stable")[:, :alpha]
            w = np.zeros_like(f)
            np.put_along_axis(w, top, np.broadcast_to(ranks, top.shape), axis=1)
            wc = w * self._cdf(_distances(f, self.means_, self.distance, self.eu_weight))
            v = np.concatenate([(f * wc).sum(1, keepdims=True), f * (1 - wc)], axis=1)
            lse = logsumexp(v, axis=1)
            out[sl] = lse - v[:, 0] if self.readout == "unknown" else v.max(1) - lse
        return out
