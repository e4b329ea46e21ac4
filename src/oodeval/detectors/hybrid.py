"""Hybrid detectors combining features with logits: ViM (NNGuide lives in neighbours.py)."""

from __future__ import annotations

import numpy as np
import scipy.linalg

from ..features import FeatureSet
from . import register
from ._backend import compute_of
from ._common import as64, scatter
from .base import Detector

__all__ = ["ViM", "vim_dim"]


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
    ``precision`` ("float32" products with float64 sums, default, or "float64") and ``device``
    (None = numpy, or a torch device): see ``_backend``.
    """

    needs = ("features", "head")
    fit_needs = ("features", "head")

    def __init__(self, dim: int | None = None, precision: str = "float32", device: str | None = None) -> None:
        self.dim = dim
        self.precision = precision
        self.device = device

    def _fit(self, train: FeatureSet) -> None:
        z, w, b = train.features, as64(train.weight), as64(train.bias)
        d = z.shape[1]
        k = vim_dim(d) if self.dim is None else int(self.dim)
        if not 0 < k < d:
            raise ValueError(f"vim dim must be in [1, {d - 1}] for {d}-d features, got {k}")
        self.principal_dim_ = k
        # u = -pinv(W) b, the minimum-norm least-squares solution (complete orthogonal
        # factorisation: the same vector as the SVD pseudo-inverse, without forming it)
        self.origin_ = -scipy.linalg.lstsq(w, b, lapack_driver="gelsy")[0]
        comp = compute_of(self)
        s, n = scatter(z, self.origin_, comp=comp)
        evals, evecs = np.linalg.eigh(s / n)
        order = np.argsort(evals)[::-1]
        self.residual_basis_ = np.ascontiguousarray(evecs[:, order[k:]])
        max_logit, residual = self._parts(comp, train.features, train.weight, train.bias)
        self.alpha_ = float(max_logit.sum() / residual.sum()) if residual.sum() > 0 else 0.0

    def residual_norm(self, z: np.ndarray) -> np.ndarray:
        """||(z - u) R|| in float64 for rows z (the virtual logit before scaling by alpha)."""
        return np.linalg.norm((as64(z) - self.origin_) @ self.residual_basis_, axis=1)

    def _parts(self, comp, z: np.ndarray, weight: np.ndarray, bias: np.ndarray, readout=None):
        """(readout of the logits, ||(z - u) R||) per row as float64; readout defaults to max f."""
        w, b = comp.put(weight).T, comp.put(bias)
        origin, basis = comp.put(self.origin_), comp.put(self.residual_basis_)
        readout = readout or comp.rowmax

        def centre(a, out) -> None:
            comp.subtract(a, origin, out)

        logit, residual = [], []
        chunks = list(comp.chunks(len(z), max(z.shape[1], w.shape[1])))
        buf = comp.empty((chunks[0].stop - chunks[0].start, z.shape[1]))  # z - u of each chunk
        for sl in chunks:
            zc = comp.put(z[sl])
            f = zc @ w
            f += b
            logit.append(comp.get(comp.by_rows(readout, f)))
            centred = buf[: len(zc)]
            comp.by_rows(centre, zc, centred)
            residual.append(comp.get(comp.by_rows(comp.rownorm, centred @ basis)))
        return np.concatenate(logit), np.concatenate(residual)

    def _score(self, x: FeatureSet) -> np.ndarray:
        comp = compute_of(self)
        energy, residual = self._parts(comp, x.features, x.weight, x.bias, comp.logsumexp)
        return energy - self.alpha_ * residual
