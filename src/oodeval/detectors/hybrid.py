"""Hybrid detectors combining features with logits: ViM (NNGuide lives in neighbours.py)."""

from __future__ import annotations

import numpy as np

from ..features import FeatureSet
from . import register
from ._common import as64, chunks, energy, head_logits, scatter
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
    """

    needs = ("features", "head")
    fit_needs = ("features", "head")

    def __init__(self, dim: int | None = None) -> None:
        self.dim = dim

    def _fit(self, train: FeatureSet) -> None:
        z, w, b = train.features, as64(train.weight), as64(train.bias)
        d = z.shape[1]
        k = vim_dim(d) if self.dim is None else int(self.dim)
        if not 0 < k < d:
            raise ValueError(f"vim dim must be in [1, {d - 1}] for {d}-d features, got {k}")
        self.principal_dim_ = k
        self.origin_ = -np.linalg.pinv(w) @ b
        s, n = scatter(z, self.origin_)
        evals, evecs = np.linalg.eigh(s / n)
        order = np.argsort(evals)[::-1]
        self.residual_basis_ = np.ascontiguousarray(evecs[:, order[k:]])
        max_logit, residual = 0.0, 0.0
        for sl in chunks(len(z), max(d, w.shape[0])):
            zc = as64(z[sl])
            max_logit += head_logits(zc, w, b).max(axis=1).sum()
            residual += self.residual_norm(zc).sum()
        self.alpha_ = float(max_logit / residual) if residual > 0 else 0.0

    def residual_norm(self, z: np.ndarray) -> np.ndarray:
        """||(z - u) R|| for float rows z (the virtual logit before scaling by alpha)."""
        return np.linalg.norm((as64(z) - self.origin_) @ self.residual_basis_, axis=1)

    def _score(self, x: FeatureSet) -> np.ndarray:
        z = x.features
        out = []
        for sl in chunks(len(z), max(z.shape[1], x.weight.shape[0])):
            zc = as64(z[sl])
            out.append(energy(head_logits(zc, x.weight, x.bias)) - self.alpha_ * self.residual_norm(zc))
        return np.concatenate(out)
