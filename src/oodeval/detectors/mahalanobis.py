"""The Mahalanobis family: Mahalanobis, relative Mahalanobis, and their ++ (l2-normalised) forms.

Class-conditional Gaussians with one shared covariance fitted on ID-train features with their
true labels (rows labelled -1 are ignored). Means and scatter accumulate in float64 in two
chunked passes (means first, then the scatter of the class-centred rows, which avoids the
cancellation of E[zz^T] - mu mu^T); the precision is the eigh-based pseudo-inverse.
Hyperparameters of all four: ``precision`` ("float32" products with float64 accumulation, the
default, or "float64") and ``device`` (None = numpy, or a torch device); see ``_backend``.
"""

from __future__ import annotations

import numpy as np

from ..features import FeatureSet
from . import register
from ._backend import compute_of
from ._common import class_means, labelled, pinv_sym, scatter
from .base import Detector

__all__ = ["Mahalanobis", "RelativeMahalanobis", "MahalanobisPP", "RelativeMahalanobisPP"]


class _MahalanobisBase(Detector):
    needs = ("features",)
    fit_needs = ("features", "labels")
    normalise = False
    relative = False

    def __init__(self, precision: str = "float32", device: str | None = None) -> None:
        self.precision = precision
        self.device = device

    def _fit(self, train: FeatureSet) -> None:
        who = type(self).__name__
        comp = compute_of(self)
        _, classes = labelled(train.labels, who)
        self.classes_ = classes
        self.means_, self.counts_ = class_means(train.features, train.labels, classes, self.normalise, comp)
        s, n = scatter(train.features, self.means_, train.labels, classes, self.normalise, comp)
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
        """-min_c (z - mu_c)' P (z - mu_c) = -(z'Pz + min_c (mu_c'P mu_c - 2 z'P mu_c)): the two
        products and the (N, C) term in the product precision, z'Pz accumulated in float64."""
        z = x.features
        if z.shape[1] != self.means_.shape[1]:
            raise ValueError(f"{type(self).__name__} was fitted on {self.means_.shape[1]}-d features, got {z.shape[1]}")
        comp = compute_of(self)
        prec, means, const = comp.put(self.precision_), comp.put(self.means_).T, comp.put(self.mean_norms_)
        if self.relative:
            bg_mean, bg_prec = comp.put(self.background_mean_), comp.put(self.background_precision_)

        def block(c):
            if self.normalise:
                c = comp.normalise(c)
            zp = c @ prec
            t = zp @ means
            t *= -2.0
            t += const
            d = comp.rowdot(zp, c) + comp.rowmin(t)
            d = d * (d > 0)
            if self.relative:
                r = comp.centred(c, bg_mean)
                d = d - comp.rowdot(r @ bg_prec, r)
            return -d

        return comp.map_rows(block, z, max(z.shape[1], len(self.means_)))


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
