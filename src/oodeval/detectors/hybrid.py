"""Hybrid detectors combining features with logits: ViM, pNML (NNGuide lives in neighbours.py)."""

from __future__ import annotations

import numpy as np
import scipy.linalg

from ..errors import InputError
from ..features import FeatureSet
from ..params import COMPUTE, Integral, Interval, Real
from . import REGISTRY, register
from ._backend import Compute, _torch, one_blas_thread
from ._common import as64, eigh_one_thread, float32_centre, labelled, scatter, whitening
from ._peers import PeerMethod
from .base import Detector
from .mahalanobis import WHITENED_ROUNDING_LIMIT

__all__ = ["ViM", "PNML", "vim_dim", "logit_origin"]

#: largest cond(G) = cond(W)^2 for which :func:`logit_origin` solves through the Gram matrix G:
#: the first solve is off by at most cond(G) eps (1e-4 here) and each refinement step multiplies
#: that error by cond(G) eps again, down to cond(W) eps; a worse-conditioned head goes through gelsy
GRAM_CONDITION_LIMIT = 1e12
#: refinement steps of :func:`logit_origin`
REFINE_STEPS = 2


@one_blas_thread()
def logit_origin(w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """u = -pinv(W) b for a (C, D) head: the minimum-norm least-squares solution of W u = -b.

    Through the Cholesky factor of the smaller Gram matrix G: u = W^T y with G y = -b, G = W W^T
    (C <= D), or G u = -W^T b with G = W^T W (C > D), each followed by :data:`REFINE_STEPS`
    steps of refinement on the residual r = -b - W u of the original system (u += W^T G^-1 r,
    or u += G^-1 W^T r: the corrected semi-normal equations, Bjorck 1987). For a 1000 x 1024 head
    that is one product and a 1000^3 / 3 factorisation, 0.04 s, against 0.1-0.2 s for LAPACK's
    complete orthogonal factorisation (gelsy). Where G is singular or LAPACK's estimate of
    cond(G) exceeds :data:`GRAM_CONDITION_LIMIT`, gelsy solves it, with numpy's pseudo-inverse
    cutoff (singular values under max(C, D) eps of the largest count as zero; gelsy's default
    cutoff, eps, kept a numerically zero one and returned |u| ~ 1e15). It runs on one BLAS
    thread: its products (numpy's BLAS) and factorisations (scipy's) alternate, and on two
    threads each met the other's idle threads spinning, 0.03-0.17 s a call, against 0.03 s.
    """
    w, b = as64(w), as64(b)
    wide = w.shape[0] <= w.shape[1]
    gram = w @ w.T if wide else w.T @ w
    factor, info = scipy.linalg.lapack.dpotrf(gram)
    if info == 0:
        rcond, info = scipy.linalg.lapack.dpocon(factor, np.abs(gram).sum(axis=0).max())
    if info != 0 or not rcond * GRAM_CONDITION_LIMIT >= 1:
        return -scipy.linalg.lstsq(w, b, cond=max(w.shape) * np.finfo(np.float64).eps, lapack_driver="gelsy")[0]

    def step(r: np.ndarray) -> np.ndarray:  # the least-norm / least-squares correction for residual r
        solve = lambda v: scipy.linalg.cho_solve((factor, False), v)  # noqa: E731
        return w.T @ solve(r) if wide else solve(w.T @ r)

    u = step(-b)
    for _ in range(REFINE_STEPS):
        u += step(-b - w @ u)
    return u


def vim_dim(d: int) -> int:
    """ViM's principal-space size D': 1000 if D >= 2048, 512 if D >= 768, else D // 2."""
    if d >= 2048:
        return 1000
    if d >= 768:
        return 512
    return d // 2


@register("vim", tags=("paper21", "hybrid"), order=20)
class ViM(Detector):
    """ViM: s = logsumexp(f) - alpha ||(z - u) R||, R the residual (non-principal) eigenvectors.

    Wang et al., "ViM: Out-of-distribution with virtual-logit matching", CVPR 2022.
    u = -pinv(W) b (the origin of the logit space); principal space = the top-D' eigenvectors
    (eigh) of the uncentred covariance of (z - u) over ID train; R spans the rest. alpha =
    mean_train(max f) / mean_train(||(z - u) R||), fitted on ID train. D' (``dim``) defaults to
    the paper's rule: 1000 if D >= 2048, 512 if D >= 768, else D / 2. f = W z + b from the head.
    The release uses np.linalg.eig on the symmetric covariance; eigh is the right routine.
    ``compute_dtype`` ("float32" products with float64 sums, default, or "float64") and ``device``
    (None = numpy, or a torch device): see ``_backend``. The fit (scatter about u, eigh) is
    float64: the residual space is the covariance's smallest eigenvalues, which a float32 scatter
    cannot resolve. float32 guarantees: the residual is (z - m) R + (m - u) R, m the ID-train
    mean (rounded to float32, so z - m is rounded relative to itself) and (m - u) R a float64 vector, so its error is about
    sqrt(D) eps |z - m| (eps = 2^-24) whatever |u| (a near-singular head puts u far away) or the
    features' offset; the energy is as in the logit detectors, of an sgemm of the head.
    """

    label = "ViM"

    needs = ("features", "head")
    fit_needs = ("features", "head")

    constraints = {"dim": (Interval(Integral, 1, None), None), **COMPUTE}

    def __init__(self, dim: int | None = None, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.dim = dim
        self.compute_dtype = compute_dtype
        self.device = device

    def _fit(self, train: FeatureSet) -> None:
        z = train.features
        d = z.shape[1]
        k = vim_dim(d) if self.dim is None else int(self.dim)
        if not 0 < k < d:
            raise InputError(f"detector 'vim': dim={k} must be an integer in [1, {d - 1}] for {d}-d features")
        self.principal_dim_ = k
        self.origin_ = logit_origin(train.weight, train.bias)
        comp = self._compute()
        # float64: the residual space is the smallest eigenvalues', which a float32 scatter cannot resolve
        s, n, centred_sum = scatter(z, self.origin_, comp=Compute("float64", comp.device), with_sum=True)
        evals, evecs = eigh_one_thread(s / n)
        order = np.argsort(evals)[::-1]
        self.residual_basis_ = np.ascontiguousarray(evecs[:, order[k:]])
        # the mean from the scatter's pass: sum(z - u) / n + u, float64 (its error, eps64 |u|, is
        # far below the float32 rounding of the centre it becomes)
        self.train_mean_ = float32_centre(centred_sum / n + self.origin_)
        self.mean_residual_ = (self.train_mean_ - self.origin_) @ self.residual_basis_
        max_logit, residual = self._parts(comp, train.features, train.weight, train.bias, energy=False)
        self.alpha_ = float(max_logit.sum() / residual.sum()) if residual.sum() > 0 else 0.0

    def residual_norm(self, z: np.ndarray) -> np.ndarray:
        """||(z - u) R|| in float64 for rows z (the virtual logit before scaling by alpha)."""
        return np.linalg.norm((as64(z) - self.origin_) @ self.residual_basis_, axis=1)

    def _parts(self, comp, z: np.ndarray, weight: np.ndarray, bias: np.ndarray, energy: bool):
        """(logsumexp f if ``energy`` else max f, ||(z - u) R||) per row as float64, f = W z + b:
        both products and their readouts block by block (:meth:`Compute.by_rows`). The residual
        is (z - m) R + (m - u) R, m the ID-train mean rounded to float32: z - m is rounded relative
        to itself and the far origin's part is one float64 vector, so its float32 error does not grow with
        |u| (a near-singular head puts u far from the features) or with the features' offset."""
        w, b = comp.put(weight).T, comp.put(bias)
        mean, basis = comp.put(self.train_mean_), comp.put(self.residual_basis_)
        shift = comp.put(self.mean_residual_, "float64")

        def block(c):
            part = comp.put(comp.centred(c, mean) @ basis, "float64")
            f = c @ w
            f += b
            logit = comp.logsumexp(f, overwrite=True) if energy else comp.rowmax(f)
            return logit, comp.rownorm(part + shift)

        return comp.map_rows(block, z, max(z.shape[1], w.shape[1]))

    def _score(self, x: FeatureSet) -> np.ndarray:
        comp = self._compute()
        energy, residual = self._parts(comp, x.features, x.weight, x.bias, energy=True)
        return energy - self.alpha_ * residual


@register("pnml", tags=("hybrid", "since-paper"))
class PNML(PeerMethod):
    """pNML regret: s = -R(x), R = log(sum_c p_c / (p_c + (1 - p_c) p_c^k)) / log C (higher = ID).

    Bibas, Feder & Hassner, "Single layer predictive normalized maximum likelihood for
    out-of-distribution detection", NeurIPS 2021, as pytorch-ood 0.4.0's ``PNML``
    (``pytorch_ood/detector/pnml.py``): x = z / ||z||, k = x' P x / (1 + x' P x) with P =
    pinv(X'X), X the l2-normalised labelled ID-train features; p = softmax(W x + b) (the head on
    the normalised feature), clamped to [``eps``, 1 - ``eps``] (default 1e-12, pytorch-ood's).
    The authors' repository (kobybibas/pnml_ood_detection) varies between versions (a bias column
    in X, the orthogonal part of x, the model's own probabilities); this follows pytorch-ood.
    Fit in float64 (X'X's small eigenvalues are what P reads), P = V V' (V from
    :func:`~oodeval.detectors._common.whitening`, numpy's pseudo-inverse cutoff), so x' P x =
    ||x V||^2; each term is computed as 1 / (1 + (1 - p_c) p_c^(k - 1)). ``compute_dtype``
    "float32" (default): the products x V and W x, log p and the terms in float32, every row sum
    in float64; where the float32 rounding of x read through sqrt(N) V exceeds the Mahalanobis
    family's limit (:data:`~oodeval.detectors.mahalanobis.WHITENED_ROUNDING_LIMIT`) the fit switches
    to float64 and records it in ``resolved_``. ``device``: None = numpy, or a torch device.
    """

    label = "pNML"

    needs = ("features", "head")
    fit_needs = ("features", "head", "labels")

    constraints = {"eps": Interval(Real, 0, 0.5, closed="neither"), **COMPUTE}

    def __init__(self, eps: float = 1e-12, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.eps = eps
        self.compute_dtype = compute_dtype
        self.device = device

    def _fit(self, train: FeatureSet) -> None:
        idx, classes = labelled(train.labels, "pnml")
        d = train.features.shape[1]
        stats = Compute("float64", self._compute().device)
        gram, _ = scatter(train.features, np.zeros((classes.size, d)), train.labels, classes, normalise=True, comp=stats)
        self.projection_ = whitening(gram)
        # |x| = 1, so each entry's float32 rounding is eps32 / 2 of 1 / sqrt(D) in rms; read through
        # sqrt(N) V (the whitening of E[x x'], in which an ID row's ||u||^2 is about the rank, as in
        # the Mahalanobis family's units)
        self.whitened_rounding_ = float(np.finfo(np.float32).eps / 2 / np.sqrt(d) * np.sqrt(idx.size) * np.linalg.norm(self.projection_))
        if self.compute_dtype == "float32" and self.whitened_rounding_ > WHITENED_ROUNDING_LIMIT:
            self.resolved_ = {"compute_dtype": "float64"}

    def _score(self, x: FeatureSet) -> np.ndarray:
        comp = self._compute()
        xp = _torch() if comp.device is not None else np
        proj, w, b = comp.put(self.projection_), comp.put(x.weight).T, comp.put(x.bias)
        lo, hi, log_c = float(np.log(self.eps)), float(np.log1p(-self.eps)), float(np.log(x.weight.shape[0]))

        def block(c):
            z = comp.normalise(c)
            u = z @ proj
            q = comp.rowdot(u, u)
            k1 = comp.put(q / (1.0 + q) - 1.0)  # k - 1, in (-1, 0]
            f = z @ w
            f += b
            log_p = xp.clip(f - comp.put(comp.logsumexp(f))[:, None], lo, hi)
            terms = 1.0 / (1.0 - xp.expm1(log_p) * xp.exp(k1[:, None] * log_p))
            return -comp.log(comp.rowsum(terms)) / log_c

        return comp.map_rows(block, x.features, max(x.features.shape[1], w.shape[1]))


REGISTRY.alias("PNML", "pnml", "pytorch-ood 0.4", tags=("pytorch-ood",))
