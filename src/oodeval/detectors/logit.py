"""Logit-based detectors: MSP, MaxLogit, KL-Matching, Energy, GEN (paper Sec. 2.1, group i).

All read only the logits f (N, C), over row chunks. ``compute_dtype="float32"`` (default): exp and
products in float32, every sum over classes accumulated in float64; "float64": all in float64.
``device``: None = numpy, or a torch device (``_backend``).
float32 guarantees: every exp is of a shifted logit (error (|f_c - shift| + 4) eps of its term,
eps = 2^-24) and every sum is float64, so a score is within a few float32 ulps of its float64
value whatever the logits' offset or scale (tests/test_detectors_precision.py, docs/performance.md).

The peers' logit methods follow (OpenOOD v1.5, pytorch-ood 0.4; opt-in, ``OptInDetector``): Entropy,
temperature scaling and OpenMax, float64 apart from Entropy's and temperature scaling's exps
(``compute_dtype`` as above); docs/detectors.md ("The peers' methods") lists their differences.
"""

from __future__ import annotations

import numpy as np

from .._extras import optional
from ..errors import InputError
from ..features import FeatureSet
from ..params import BOOLEAN, COMPUTE, POSITIVE, SEED, Instance, Integral, Interval, Options, Real
from . import REGISTRY, register
from ._backend import Compute, _torch
from ._common import chunks, class_means, labelled
from .base import Detector, OptInDetector

__all__ = ["MSP", "MaxLogit", "KLMatching", "Energy", "GEN",
           "Entropy", "TemperatureScaling", "OpenMax", "neg_entropy", "fit_temperature", "fit_temperature_lbfgs", "FITS", "weibull_mle", "WEIBULL_TRANSLATION",
           "WeightedEnergy"]


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
        return comp.map_rows(lambda f: comp.max_softmax(f if t == 1 else f / t), x.logits)


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
        return exact.map_rows(lambda f: exact.pick(f, exact.argmax(f)), x.logits)


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
        return comp.map_rows(lambda f: comp.logsumexp(f if t == 1 else f / t) * t, x.logits)


@register("gen", tags=("paper21", "logit"), order=5)
class GEN(Detector):
    """Generalized entropy, s = -sum over the M largest p_c of p_c^g (1 - p_c)^g.

    Liu, Lochman & Zach, "GEN: Pushing the limits of softmax-based OOD detection", CVPR 2023.
    Defaults g = ``gamma`` = 0.1 and M = ``top_m`` = 100 (the paper's ImageNet setting; its
    release uses the same); M is capped at the number of classes, and None takes every class
    (pytorch-ood's ``GEN`` default). The top M are found on the logits (softmax is
    monotone); their p_c and 1 - p_c are computed in float64 whatever ``compute_dtype``, so
    p_c close to 1 keeps its (1 - p_c)^g; each term is read as exp(g (log p_c + log(1 - p_c))).
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
            if comp.device is not None:
                top = comp.topk(f, m)  # holds each row's max: the log-sum-exp's shift without a pass over f
                log_top = top - comp.logsumexp(f, row_max=comp.rowmax(top))[:, None]  # float64 log p of the top M
                # p^g (1 - p)^g = exp(g (log p + log(1 - p))): one exp and one log per term, not a power
                return -(g * (log_top + (-log_top.expm1()).log())).exp().sum(dim=1)
            # numpy: the partition is a copy of the rows (a permutation of each), so the shifted exps
            # and their sum are taken in it, in place, while it is in cache (same terms, same sum)
            part = np.partition(f, f.shape[1] - m, axis=1)
            top = part[:, f.shape[1] - m :].copy()
            row_max = comp.rowmax(top)
            log_top = top - comp.logsumexp(part, overwrite=True, row_max=row_max)[:, None]  # float64 log p of the top M
            with np.errstate(divide="ignore"):  # as above; p = 1: log(1 - p) = -inf, a term of 0 (0^g)
                t = np.log(-np.expm1(log_top))
            t += log_top
            t *= g
            return -np.exp(t, out=t).sum(axis=1)

        return comp.map_rows(fn, x.logits)


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

        def softmax_sum(a, o):  # the predicted class's logit is the row max: one argmax pass for both
            k = comp.argmax(a)
            return comp.shifted_exp(a, o, comp.pick(a, k))[2], k

        for sl in chunks:
            e = buf[: sl.stop - sl.start]
            total, k = comp.by_rows(softmax_sum, comp.put(f[sl]), e)
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

        return comp.map_rows(block, x.logits)


#: libmr's FitHigh shifts the tail by this amount minus its smallest value before the Weibull
#: fit (both peers keep it); it changes the fitted CDF only slightly and is kept for agreement
WEIBULL_TRANSLATION = 10_000.0


def neg_entropy(comp: Compute, f) -> np.ndarray:
    """sum_c p_c log p_c of softmax(f) per row, float64: with e = exp(f - max f) and S = sum e,
    it is (e . (f - max f)) / S - log S, so p and log p are never formed (no log 0)."""
    shifted = comp.centred(f, comp.rowmax(f)[:, None])  # a scratch buffer inside Compute.by_rows
    e = comp.exp(shifted)
    total = comp.rowsum(e)
    log_total = comp.log(total)
    return comp.rowdot(e, shifted) / total - log_total


@register("entropy", tags=("logit",))
class Entropy(OptInDetector):
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
        return comp.map_rows(lambda f: neg_entropy(comp, f), x.logits, width=x.logits.shape[1])


#: relative change of 1 / T at which the Newton search stops, per product dtype: float64 to
#: 1e-10 (the bounded Brent search it replaced stopped at 1e-10 in log T); float32 exps resolve
#: the NLL's slope to a few float32 ulps of its terms (a few 1e-7 relative), so the root no closer
NEWTON_TOL = {"float64": 1e-10, "float32": 1e-6}
#: Newton steps at most (the bracket halves geometrically when a step leaves it)
NEWTON_MAX_ITER = 200


def fit_temperature(logits: np.ndarray, labels: np.ndarray, bounds: tuple[float, float] = (1e-3, 1e3), comp: Compute | None = None) -> tuple[float, int]:
    """(T, steps): T in ``bounds`` minimising the mean negative log-likelihood of ``labels`` under
    softmax(f / T), and the passes over the logits the search took.

    The NLL is convex in b = 1 / T (a log-sum-exp of a linear function minus a linear term), with
    slope mean(E_p[f] - f_y) and curvature mean(Var_p[f]), p = softmax(b f), so Newton's method on
    b, safeguarded by a bracket (a step that leaves it halves the bracket geometrically instead),
    reaches the one minimum in a few steps from b = 1; a minimum on the boundary means the logits
    carry no usable calibration (e.g. all predictions right: T -> 0). Each step is one pass over
    the logits: x = f - max f (formed once), e = exp(max(b x, log(tiny) + 40)) in ``comp``'s dtype,
    tiny its least normal number. A term raised to e^-47 (float32) is below float64's resolution
    of a row sum holding exp(0) = 1 for C < 3 x 10^4, and no subnormal is formed (each ~10x slower).
    Then the sums of e and e x of each row in float64, and that of e x^2 (the curvature, which sets
    only a step's length, not where the slope is 0) in ``comp``'s dtype (default: float64 throughout).
    """
    comp = comp or Compute("float64")
    f = comp.put(logits)
    x = comp.by_rows(lambda a: comp.subtract(a, comp.rowmax(a)[:, None]), f)
    y = np.asarray(labels)
    xy = comp.get(comp.pick(x, comp.put(y, "int64") if comp.device is not None else y))

    # the least exp argument formed: 40 above that of the dtype's least normal number (-47.3 in
    # float32), so neither e nor e x nor e x^2 is subnormal (some 10x slower to form), and the
    # terms raised to it stay below float64's resolution of a sum holding exp(0) = 1 (C e^-47 < 2^-53)
    least = float(np.log(np.finfo(comp.precision).tiny)) + 40

    def slope_curvature(b: float) -> tuple[float, float]:
        def block(a):
            e = a * b
            e = np.exp(np.maximum(e, least, out=e), out=e) if comp.device is None else e.clamp_min_(least).exp_()
            s0 = comp.rowsum(e)
            e *= a  # e x, each product rounded once in the product dtype (x <= 0: no cancellation)
            # the curvature sets only the step's length (the minimum is where the slope is 0), so
            # its sum stays in the product dtype: one pass fewer than a float64 row dot
            return s0, comp.rowsum(e), (e * a).sum(1) if comp.device is not None else np.einsum("ij,ij->i", e, a)

        s0, s1, s2 = (comp.get(v) for v in comp.by_rows(block, x))
        mean = s1 / s0
        return float(np.mean(mean - xy)), float(np.mean(np.maximum(s2 / s0 - mean * mean, 0.0)))

    lo, hi = 1.0 / bounds[1], 1.0 / bounds[0]
    b, tol = min(max(1.0, lo), hi), NEWTON_TOL[comp.precision]
    signs = set()  # the slope's signs seen: the minimum is bracketed once both are
    for step in range(1, NEWTON_MAX_ITER + 1):
        g, h = slope_curvature(b)
        if g == 0 and h > 0:
            break
        # g = h = 0: every exp but the labels' underflowed (every prediction right, by a margin
        # beyond the dtype's exp range): the NLL still falls towards the bound, as g < 0
        signs.add(g > 0)
        lo, hi = (lo, b) if g > 0 else (b, hi)
        if hi <= lo * (1 + tol):  # the bracket closed (at a bound: the minimum lies there)
            break
        nb = b - g / h if h > 0 else np.nan
        if abs(nb - b) <= tol * b:  # converged (the step may round onto the bracket's edge)
            b = nb
            break
        if len(signs) == 1:  # not yet bracketed: at least double (halve) b, as far from the
            # minimum the NLL can be exponentially flat (every prediction right) and Newton crawl
            nb = (min(nb, b / 2) if g > 0 else max(nb, 2 * b)) if np.isfinite(nb) else (b / 2 if g > 0 else 2 * b)
            nb = min(max(nb, lo), hi)  # a bound not yet tried is tried
        elif not lo < nb < hi:
            nb = float(np.sqrt(lo * hi))
        b = nb
    return float(1.0 / b), step


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
class TemperatureScaling(OptInDetector):
    """MSP after temperature scaling: s = max_c softmax(f / T)_c, T fitted to minimise the NLL.

    Guo et al., "On calibration of modern neural networks", ICML 2017. T minimises the mean
    negative log-likelihood of the labels on a validation split (:func:`fit_temperature`: the
    minimiser by safeguarded Newton steps on 1 / T, each one pass over the split's logits in
    ``compute_dtype``, its sums in float64; ``n_iter_`` counts them, typically 4-8, against the
    30-40 NLL evaluations of a bounded Brent search). The split: a seeded random ``val_fraction`` (default 0.1, ``seed`` 0) of the
    labelled rows of the set ``fit`` is given (the ID-train set in ``oodeval score``/``run``);
    ``val_fraction=1`` uses all of them, e.g. when that set already is a held-out validation set
    (OpenOOD fits on its ID ``val`` split). Both releases run L-BFGS (lr 0.01, 50 steps; OpenOOD
    starts at T = 1.5, pytorch-ood at 1), which need not reach the minimum: ``procedure="openood"`` /
    ``"pytorch-ood"`` runs that procedure (:func:`fit_temperature_lbfgs`, torch's L-BFGS in
    float32; their defaults profiles, with ``val_fraction=1``), ``procedure="exact"`` (default) the
    minimiser. The fitted T is recorded in ``resolved_params()``; the score is
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
            self.temperature_, self.n_iter_ = fit_temperature(logits, labels, comp=self._compute())
        else:
            self.temperature_, self.n_iter_ = fit_temperature_lbfgs(logits, labels, FITS[self.procedure]), None
        self.resolved_ = {"temperature": self.temperature_}

    def _score(self, x: FeatureSet) -> np.ndarray:
        # MSP's score of f / T (:class:`MSP`): 1 / sum_c exp(f_c / T - max f / T), each row shifted
        # by its own max (so its top term is exactly 1; a fitted T far below 1 spreads a block's
        # rows too far apart for one shift per block), the exp taken in the block's own scaled copy
        t, comp = float(self.temperature_), self._compute()

        def block(f):
            g = f / t
            return 1.0 / comp.shifted_exp(g, out=g)[2]

        return comp.map_rows(block, x.logits)


def weibull_mle(x: np.ndarray, mask: np.ndarray | None = None, steps: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Maximum-likelihood two-parameter Weibull fits (location 0) of each row of ``x`` (K, T) > 0 at
    once, over the entries where ``mask`` is True: (shape c, scale). The likelihood's stationary
    point in c is the one root of g(c) = sum w t / sum w - 1/c - mean t, w = exp(c t), t = log x -
    max log x (g rises from -inf to -mean t > 0), found by bisection on log c over [1e-6, 1e16]
    (64 halvings of its width, ln 1e22 = 50.7, leave 2.7e-18: below float64 resolution); scale = (mean x^c)^(1/c), summed about max x.
    t is log1p((x - max x) / max x), so tails shifted far from 0 (libmr's +10000) keep their
    spread. Rows with one distinct value have no finite maximum (shape inf, scale that value)."""
    x = np.asarray(x, dtype=np.float64)
    mask = np.ones(x.shape, bool) if mask is None else mask
    top = np.where(mask, x, -np.inf).max(1, keepdims=True)
    t = np.where(mask, np.log1p((np.where(mask, x, top) - top) / top), 0.0)
    count = mask.sum(1)
    mean_t = t.sum(1) / count
    lo, hi = np.full(len(x), np.log(1e-6)), np.full(len(x), np.log(1e16))
    for _ in range(steps):
        mid = (lo + hi) / 2
        c = np.exp(mid)[:, None]
        w = np.where(mask, np.exp(c * t), 0.0)
        g = (w * t).sum(1) / w.sum(1) - 1 / c[:, 0] - mean_t
        up = g > 0
        hi, lo = np.where(up, mid, hi), np.where(up, lo, mid)
    shape = np.exp((lo + hi) / 2)
    scale = top[:, 0] * np.exp(np.log((np.where(mask, np.exp(shape[:, None] * t), 0.0)).sum(1) / count) / shape)
    flat = np.where(mask, t, -np.inf).min(1) == 0  # one distinct value
    return np.where(flat, np.inf, shape), np.where(flat, top[:, 0], scale)


def _pair_distances(comp: Compute, f, f_sq: np.ndarray, m, m_sq: np.ndarray, kind: str, eu_weight: float) -> np.ndarray:
    """Distances of each row of f (N, C) to the same row of m (N, C), both on ``comp``'s backend,
    given their squared norms ``f_sq``, ``m_sq`` (float64 host), as float64 host values:
    "euclidean", "cosine" (1 - cos) or "eucos" (eu_weight * euclidean + cosine, the OSDN release's
    combination). One row dot f . m accumulated in float64 serves both: |f - m|^2 = |f|^2 + |m|^2
    - 2 f . m, whose float32 products are exact in float64 (so its error is a few float64 ulps of
    |f|^2 + |m|^2, far below the float32 rounding of the logits and means themselves)."""
    dots = comp.get(comp.rowdot(f, m))
    eu = np.sqrt(np.maximum(f_sq + m_sq - 2 * dots, 0.0))
    if kind == "euclidean":
        return eu
    norms = np.sqrt(f_sq * m_sq)
    cos = 1.0 - np.divide(dots, norms, out=np.zeros(norms.shape), where=norms > 0)
    return cos if kind == "cosine" else eu_weight * eu + cos


def _top_classes(f: np.ndarray, alpha: int) -> np.ndarray:
    """The ``alpha`` largest entries' columns of each row, largest first, ties to the lower column
    (as a stable argsort of -f): see :func:`_ranked_top`."""
    f = np.asarray(f)
    return _ranked_top(Compute(str(f.dtype)), f.copy(), alpha)[0]


def _ranked_top(comp: Compute, e, alpha: int):
    """(columns (N, alpha) on the backend, their values (N, alpha) float64 host, the next largest
    value (N,) float64 host, -inf when C = alpha) of each row of ``e``, largest first, ties to the
    lower column (as a stable argsort of -e: an argmax takes the first of equal maxima). alpha + 1
    argmax passes, each top entry set to -inf in ``e`` (a scratch copy of the logits) once taken:
    a selection of a few of the C entries, cheaper than a partition of every row."""
    rows = np.arange(len(e)) if comp.device is None else _torch().arange(len(e), device=e.device)
    cols, vals = [], []
    for r in range(min(alpha + 1, e.shape[1])):
        j = comp.argmax(e)
        vals.append(e[rows, j])
        if r < alpha:
            cols.append(j)
            e[rows, j] = -np.inf
    vals = comp.get(comp.concat([v[:, None] for v in vals]))
    rest = vals[:, alpha] if vals.shape[1] > alpha else np.full(len(vals), -np.inf)
    return comp.concat([j[:, None] for j in cols]), vals[:, :alpha], rest


@register("openmax", tags=("logit",))
class OpenMax(OptInDetector):
    """OpenMax: Weibull-recalibrated logits with an "unknown" class (Bendale & Boult, CVPR 2016).

    Fit: per class k, the mean logit vector (MAV) m_k of the ID-train rows labelled k (and, with
    ``correct_only``, predicted k) and a Weibull fit of the ``tailsize`` largest distances
    d(f, m_k) of those rows, libmr-style: the tail is shifted by 10000 - its minimum and a
    two-parameter Weibull (location 0) is fitted by maximum likelihood (:func:`weibull_mle`, every
    class at once; scipy's ``weibull_min.fit`` finds the same maximum, no native libmr). Score: the
    ``alpha`` top classes of f get weights w_r = (alpha + 1 - r) / alpha (rank r = 1..alpha), every
    other class 0; with c_k = WeibullCDF_k(d(f, m_k)), v_k = f_k (1 - w_k c_k) and v_0 = sum_k
    f_k w_k c_k; P = softmax(v_0, v_1..v_K) (only the alpha top classes' distances and CDFs are
    formed: the others have w_k = 0). ``readout`` "unknown" (default): s = -log P_0 (the score of
    both releases, -P_0: OpenOOD v1.5 ``openmax_postprocessor.py`` returns conf = -P(unknown),
    pytorch-ood P(unknown) as its outlier score; here in the log domain, so it keeps its resolution
    where P_0 is tiny); "max": s = log max_j P_j over all K + 1 entries (neither release's; it counts
    a confident "unknown" as ID).
    Defaults are OpenOOD v1.5's (``openmax_postprocessor.py``: tail 20, alpha 3, Euclidean,
    correctly classified rows; its ``openmax.yml`` sets none of them): the paper's release has
    tail 20, alpha 10, "eucos" with eu_weight 1/200; pytorch-ood 0.4's ``OpenMax``: tail 25,
    alpha 10, Euclidean (``euclid_weight`` 1.0), all labelled
    rows. A class whose fit set is empty has no model and gets c_k = 1.
    The MAVs and the fit rows' distances run in ``compute_dtype`` (below) on numpy, the Weibull
    fits in float64. Scoring a block of rows: a selection of the alpha + 1 largest logits
    (:func:`_ranked_top`), the alpha
    distances to the top classes' MAVs, and one exp and row sum over the other logits, shifted by
    the largest of the K + 1 entries (so a sum never overflows and the largest term is 1): in
    ``compute_dtype`` ("float32", default: the distances' and the exps' float32 terms summed in
    float64, as the logit detectors; "float64"), on ``device`` (None = numpy, or a torch device).
    """

    needs = ("logits",)
    fit_needs = ("logits", "labels")

    constraints = {"tailsize": Interval(Integral, 2, None), "alpha": Interval(Integral, 1, None), "distance": Options("euclidean", "cosine", "eucos"),
                   "eu_weight": Interval(Real, 0, None), "correct_only": BOOLEAN, "readout": Options("unknown", "max"), **COMPUTE}  # fmt: skip

    def __init__(
        self,
        tailsize: int = 20,
        alpha: int = 3,
        distance: str = "euclidean",
        eu_weight: float = 0.005,
        correct_only: bool = True,
        readout: str = "unknown",
        compute_dtype: str = "float32",
        device: str | None = None,
    ) -> None:
        self.tailsize = tailsize
        self.alpha = alpha
        self.distance = distance
        self.eu_weight = eu_weight
        self.correct_only = correct_only
        self.readout = readout
        self.compute_dtype = compute_dtype
        self.device = device

    def _fit(self, train: FeatureSet) -> None:
        y = np.asarray(train.labels)
        c = train.logits.shape[1]
        fit_y = np.where(y >= 0, y, -1)
        if self.correct_only:
            pred = np.concatenate([np.asarray(train.logits[sl]).argmax(1) for sl in chunks(len(y), c)])
            fit_y = np.where(pred == y, fit_y, -1)
        have = np.unique(fit_y[fit_y >= 0])
        if have.size == 0:
            raise InputError("openmax found no (correctly classified) labelled ID-train rows to fit")
        self.means_ = np.zeros((c, c))
        host = Compute(self.compute_dtype)
        self.means_[have] = class_means(train.logits, fit_y, have, comp=host)[0]
        rows = np.flatnonzero(fit_y >= 0)
        means = host.put(self.means_)
        self.means_sq_ = host.get(host.rowdot(means, means))  # of the means as the products read them
        # each fit row's distance to its own class's MAV, a block of rows per core (a row without
        # a model is measured against row 0 and dropped)

        def fit_distances(f, k):
            f = host.put(f)
            return _pair_distances(host, f, host.get(host.rowdot(f, f)), means[k], self.means_sq_[k], self.distance, self.eu_weight)

        dist = host.by_rows(fit_distances, train.logits, np.maximum(fit_y, 0))[rows]
        # the tailsize largest distances of each class: sorted by (class, distance), each class's last ones
        order = np.lexsort((dist, fit_y[rows]))
        cls, dist = fit_y[rows][order], dist[order]
        end = np.searchsorted(cls, have, side="right")
        count = np.minimum(end - np.searchsorted(cls, have), int(self.tailsize))
        width = int(count.max())
        pos = end[:, None] - width + np.arange(width)[None, :]
        mask = np.arange(width)[None, :] >= (width - count)[:, None]
        tail = np.where(mask, dist[np.clip(pos, 0, len(dist) - 1)], np.inf)
        shift = WEIBULL_TRANSLATION - tail.min(1)
        shape, scale = weibull_mle(np.where(mask, tail + shift[:, None], 1.0), mask)
        self.weibull_ = np.full((c, 3), np.nan)  # shape, scale, shift per class
        self.weibull_[have] = np.stack([shape, scale, shift], axis=1)

    @staticmethod
    def _cdf(d: np.ndarray, shape: np.ndarray, scale: np.ndarray, shift: np.ndarray) -> np.ndarray:
        """WeibullCDF(d + shift) of each distance under its class's fit; 1 for a class without one."""
        with np.errstate(over="ignore", invalid="ignore"):
            cdf = -np.expm1(-(((d + shift) / scale) ** shape))
        cdf = np.where(np.isinf(shape), ((d + shift) > scale).astype(float), cdf)
        return np.where(np.isnan(shape), 1.0, cdf)

    def _score(self, x: FeatureSet) -> np.ndarray:
        comp = self._compute()
        alpha = min(int(self.alpha), x.logits.shape[1])
        ranks = (alpha + 1 - np.arange(1, alpha + 1)) / alpha
        means = comp.put(self.means_)
        unknown = self.readout == "unknown"

        def block(f):
            e = comp.subtract(f, 0.0, out=comp.empty(f.shape))  # a copy: the top entries become -inf in it
            top, ft, rest_max = _ranked_top(comp, e, alpha)
            cols, f_sq = comp.host(top), comp.get(comp.rowdot(f, f))
            dist = np.stack([_pair_distances(comp, f, f_sq, means[top[:, j]], self.means_sq_[cols[:, j]], self.distance, self.eu_weight)
                             for j in range(alpha)], axis=1)  # fmt: skip
            shape, scale, shift = (p[cols] for p in self.weibull_.T)
            wc = ranks * self._cdf(dist, shape, scale, shift)
            vt, v0 = ft * (1 - wc), (ft * wc).sum(1)
            m = np.maximum(np.maximum(rest_max, vt.max(1)), v0)  # the largest of the K + 1 entries
            shift_b = comp.put(m)  # rounded to the product dtype: the exps' shift
            comp.subtract(e, shift_b[:, None], out=e)  # the top classes' entries stay -inf: vt, added below
            rest = comp.get(comp.rowsum(comp.exp(e) if comp.device is not None else np.exp(e, out=e))) * np.exp(comp.get(shift_b) - m)
            lse = m + np.log(rest + np.exp(vt - m[:, None]).sum(1) + np.exp(v0 - m))
            return comp.put(lse - v0 if unknown else m - lse, "float64")

        return comp.map_rows(block, x.logits, width=x.logits.shape[1])


@register("webo", tags=("logit", "since-paper"))
class WeightedEnergy(OptInDetector):
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
            return comp.map_rows(lambda f: comp.logsumexp(f), x.logits)
        shift = comp.put(log_w)
        return comp.map_rows(lambda f: comp.logsumexp(f + shift, overwrite=True), x.logits)


REGISTRY.alias("WeightedEBO", "webo", "pytorch-ood 0.4", tags=("pytorch-ood",))
