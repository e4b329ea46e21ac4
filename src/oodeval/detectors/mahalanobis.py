"""The Mahalanobis family: Mahalanobis, relative Mahalanobis, and their ++ (l2-normalised) forms.

Class-conditional Gaussians with one shared covariance fitted on ID-train features with their
true labels (rows labelled -1 are ignored). Means and scatter accumulate in float64 in two
chunked passes (means first, then the scatter of the class-centred rows, which avoids the
cancellation of E[zz^T] - mu mu^T); the precision is the eigh-based pseudo-inverse.
"""

from __future__ import annotations

import numpy as np

from ..features import FeatureSet
from . import register
from ._common import as64, chunks, class_means, l2_normalise, labelled, pinv_sym, scatter
from .base import Detector

__all__ = ["Mahalanobis", "RelativeMahalanobis", "MahalanobisPP", "RelativeMahalanobisPP"]


def _min_sq_distance(z: np.ndarray, means: np.ndarray, precision: np.ndarray, const: np.ndarray) -> np.ndarray:
    """min_c (z - mu_c)^T P (z - mu_c) for float64 rows z, via z'Pz - 2 z'P mu_c + mu_c'P mu_c
    (``const`` = mu_c'P mu_c, precomputed at fit)."""
    zp = z @ precision
    quad = np.einsum("nd,nd->n", zp, z)
    cross = zp @ means.T
    return np.maximum(quad[:, None] - 2.0 * cross + const[None, :], 0.0).min(axis=1)


def _sq_distance(z: np.ndarray, mean: np.ndarray, precision: np.ndarray) -> np.ndarray:
    c = z - mean
    return np.einsum("nd,nd->n", c @ precision, c)


class _MahalanobisBase(Detector):
    needs = ("features",)
    fit_needs = ("features", "labels")
    normalise = False
    relative = False

    def _fit(self, train: FeatureSet) -> None:
        who = type(self).__name__
        _, classes = labelled(train.labels, who)
        self.classes_ = classes
        self.means_, self.counts_ = class_means(train.features, train.labels, classes, self.normalise)
        s, n = scatter(train.features, self.means_, train.labels, classes, self.normalise)
        self.covariance_ = s / n
        self.precision_ = pinv_sym(self.covariance_)
        self.mean_norms_ = np.einsum("cd,cd->c", self.means_ @ self.precision_, self.means_)
        if self.relative:
            # one Gaussian on all labelled rows: mean = count-weighted class means, scatter =
            # within-class scatter + between-class scatter (exact identity, no third pass)
            self.background_mean_ = self.counts_ @ self.means_ / n
            between = (self.means_ - self.background_mean_) * np.sqrt(self.counts_)[:, None]
            self.background_covariance_ = (s + between.T @ between) / n
            self.background_precision_ = pinv_sym(self.background_covariance_)

    def _score(self, x: FeatureSet) -> np.ndarray:
        z = x.features
        if z.shape[1] != self.means_.shape[1]:
            raise ValueError(f"{type(self).__name__} was fitted on {self.means_.shape[1]}-d features, got {z.shape[1]}")
        out = []
        for sl in chunks(len(z), max(z.shape[1], len(self.means_))):
            c = as64(z[sl])
            if self.normalise:
                c = l2_normalise(c)
            d = _min_sq_distance(c, self.means_, self.precision_, self.mean_norms_)
            if self.relative:
                d = d - _sq_distance(c, self.background_mean_, self.background_precision_)
            out.append(-d)
        return np.concatenate(out)


@register("mahalanobis", tags=("paper21", "feature"), order=10)
class Mahalanobis(_MahalanobisBase):
    """s = -min_c (z - mu_c)^T S^-1 (z - mu_c), S the shared (tied) class covariance.

    Lee et al., "A simple unified framework for detecting OOD samples and adversarial attacks",
    NeurIPS 2018, on the penultimate feature without input pre-processing or layer ensembles
    (the form the Fi-ImageNet-1k paper and ViM's release use). mu_c, S: maximum-likelihood
    estimates from ID-train features with their true labels. No hyperparameters.
    """


@register("relative_mahalanobis", tags=("paper21", "feature"), order=11)
class RelativeMahalanobis(_MahalanobisBase):
    """s = -min_c (MD_c(z) - MD_0(z)), MD_0 the distance to one Gaussian fitted on all ID-train z.

    Ren et al., "A simple fix to Mahalanobis distance for improving near-OOD detection", 2021.
    MD_0 uses the mean and covariance of all (labelled) train rows, centred at the global mean.
    pytorch-ood's RMD builds the background covariance differently (see docs/detectors.md);
    this follows the paper.
    """

    relative = True


@register("mahalanobis_pp", tags=("paper21", "feature"), order=12)
class MahalanobisPP(_MahalanobisBase):
    """Mahalanobis++: Mahalanobis on l2-normalised features, train and test alike.

    Mueller & Hein, "Mahalanobis++: Improving OOD detection via feature normalization", ICML 2025.
    Invariant to rescaling any single sample. No hyperparameters.
    """

    normalise = True


@register("relative_mahalanobis_pp", tags=("paper21", "feature"), order=13)
class RelativeMahalanobisPP(_MahalanobisBase):
    """Relative Mahalanobis++: s = -min_c (MD_c(z/|z|) - MD_0(z/|z|)), all Gaussians fitted on
    l2-normalised ID-train features (Mueller & Hein, ICML 2025, applied to Ren et al. 2021).
    No hyperparameters."""

    normalise = True
    relative = True
