"""The Mahalanobis family: Mahalanobis, relative Mahalanobis, and their ++ (l2-normalised) forms.

Class-conditional Gaussians with one shared covariance S fitted on ID-train features with their
true labels (rows labelled -1 are ignored). The fit is float64 throughout (means, then the
scatter of the class-centred rows, then eigh): a float32 scatter cannot resolve covariance
eigenvalues below ~1e-6 of the largest, and the inverse reads exactly those. S^+ = W W^T with
W = V_k L_k^-1/2 over the eigenvalues above numpy's pseudo-inverse cutoff (max(D) eps of the
largest), so every distance is a squared norm in whitened, centred coordinates:

    (z - mu_c)' S^+ (z - mu_c) = ||u - nu_c||^2,  u = (z - m) W,  nu_c = (mu_c - m) W,

m the ID-train mean rounded to float32 (z - m is then rounded relative to itself, not to |m|). ``compute_dtype="float32"`` (default)
runs u = (z - m) W and the (N, C) cross term u nu^T as sgemm and sums ||u||^2 in float64; its
error is a few float32 ulps of ||u||^2 + ||nu_c||^2, in units where the ID distances are about
the rank k: it does not grow with the features' offset or scale (both removed before any float32
rounding), and with the conditioning only as the rounding of z - m read through W. Where that
rounding's expected size exceeds :data:`WHITENED_ROUNDING_LIMIT` (a covariance conditioned far
beyond 1e8), the fit switches the detector to float64 and says so in ``resolved_`` (the results'
``hyperparameters_resolved``). ``"float64"``: all in float64.
``device``: None = numpy, or a torch device; see ``_backend``.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from ..features import FeatureSet
from ..params import COMPUTE
from . import register
from ._backend import Compute
from ._common import class_means, float32_centre, labelled, scatter, whitening
from .base import Detector

#: largest expected norm of the float32 rounding of z - m read through the whitening W (eps32
#: times the rms of z - m times ||W||_F, :func:`_whitened_rounding`) for which the float32 path
#: runs: a distance's error is then about sqrt(2) times this of the ID distances' spread, 3e-3 (the
#: conditioned problems of tests/test_detectors_precision.py reach 6e-4 at condition number 1e8,
#: Spearman 1.000000); above it the detector computes in float64 and records that in ``resolved_``
WHITENED_ROUNDING_LIMIT = 2e-3

__all__ = ["Mahalanobis", "RelativeMahalanobis", "MahalanobisPP", "RelativeMahalanobisPP"]


class _MahalanobisBase(Detector):
    needs = ("features",)
    fit_needs = ("features", "labels")
    normalise = False
    relative = False

    constraints = COMPUTE

    def __init__(self, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.compute_dtype = compute_dtype
        self.device = device

    def _fit(self, train: FeatureSet) -> None:
        who = type(self).__name__
        stats = Compute("float64", self._compute().device)
        _, classes = labelled(train.labels, who)
        self.classes_ = classes
        self.means_, self.counts_ = class_means(train.features, train.labels, classes, self.normalise, stats)
        s, n = scatter(train.features, self.means_, train.labels, classes, self.normalise, stats)  # float64
        self.covariance_ = s / n
        self.whitening_ = whitening(self.covariance_)
        # the ID-train mean (count-weighted class means) rounded to float32: the centre of every
        # whitened coordinate
        mean = self.counts_ @ self.means_ / n
        self.center_ = float32_centre(mean)
        self.whitened_means_ = (self.means_ - self.center_) @ self.whitening_
        self.whitened_mean_norms_ = np.einsum("ck,ck->c", self.whitened_means_, self.whitened_means_)
        if self.relative:
            # one Gaussian on all labelled rows, centred at their mean: scatter = within-class
            # scatter + between-class scatter (exact identity, no third pass); its whitened
            # coordinates are (z - center_) W_0 - background_offset_
            between = (self.means_ - mean) * np.sqrt(self.counts_)[:, None]
            self.background_covariance_ = (s + between.T @ between) / n
            self.background_whitening_ = whitening(self.background_covariance_)
            self.background_offset_ = (mean - self.center_) @ self.background_whitening_
        widths = [self.whitening_] + ([self.background_whitening_] if self.relative else [])
        self.whitened_rounding_ = _whitened_rounding(self.covariance_, self.means_ - self.center_, self.counts_, widths)
        if self.compute_dtype == "float32" and self.whitened_rounding_ > WHITENED_ROUNDING_LIMIT:
            self.resolved_ = {"compute_dtype": "float64"}

    def _score(self, x: FeatureSet) -> np.ndarray:
        """-min_c ||u - nu_c||^2 = -(||u||^2 + min_c (||nu_c||^2 - 2 u nu_c)), u = (z - m) W; the
        relative forms add ||(z - m) W_0||^2. z - m is one subtraction in the product precision
        (m float32-representable: an error relative to z - m); the ++ forms normalise and centre
        each block in float64 first (a normalised row's rounding would be relative to |z / |z||)."""
        z = x.features
        if z.shape[1] != self.means_.shape[1]:
            raise InputError(f"{type(self).__name__} was fitted on {self.means_.shape[1]}-d features, got {z.shape[1]}")
        comp = self._compute()
        # -2 nu_c: the cross term's factor folded into the product (a power of two: exact)
        white, nu = comp.put(self.whitening_), comp.put(-2.0 * self.whitened_means_).T
        block_dtype = "float64" if self.normalise else None
        const, center = comp.put(self.whitened_mean_norms_), comp.put(self.center_, block_dtype)
        if self.relative:
            bg_white, bg_offset = comp.put(self.background_whitening_), comp.put(self.background_offset_)

        def block(c):
            r = comp.put(comp.subtract(comp.normalise(c), center)) if self.normalise else comp.centred(c, center)
            u = r @ white
            t = u @ nu
            t += const
            d = comp.rowdot(u, u) + comp.rowmin(t)
            d = d * (d > 0)
            if self.relative:
                u0 = r @ bg_white
                u0 -= bg_offset
                d = d - comp.rowdot(u0, u0)
            return -d

        return comp.map_rows(block, z, max(z.shape[1], len(self.means_)), dtype=block_dtype)


def _whitened_rounding(covariance: np.ndarray, centred_means: np.ndarray, counts: np.ndarray, whitenings: list) -> float:
    """eps32 x rms(z - m) x max ||W||_F: the expected norm of the whitened image of z - m's float32
    rounding (each entry off by eps32 of its size, in no particular direction) over ID train, with
    rms(z - m)^2 = (trace S + the between-class variance) / D; the largest over the Gaussians."""
    spread = np.trace(covariance) + counts @ np.einsum("cd,cd->c", centred_means, centred_means) / counts.sum()
    width = max(np.linalg.norm(w) for w in whitenings)
    return float(np.finfo(np.float32).eps / 2 * np.sqrt(spread / covariance.shape[0]) * width)


@register("mahalanobis", tags=("paper21", "feature"), order=10)
class Mahalanobis(_MahalanobisBase):
    """s = -min_c (z - mu_c)^T S^-1 (z - mu_c), S the shared (tied) class covariance.

    Lee et al., "A simple unified framework for detecting OOD samples and adversarial attacks",
    NeurIPS 2018, on the penultimate feature without input pre-processing or layer ensembles
    (the form the Fi-ImageNet-1k paper and ViM's release use). mu_c, S: maximum-likelihood
    estimates from ID-train features with their true labels; S^-1 the pseudo-inverse. No
    hyperparameters. float32: see the module docstring (centred, whitened form).
    """

    label = "Maha"


@register("relative_mahalanobis", tags=("paper21", "feature"), order=11)
class RelativeMahalanobis(_MahalanobisBase):
    """s = -min_c (MD_c(z) - MD_0(z)), MD_0 the distance to one Gaussian fitted on all ID-train z.

    Ren et al., "A simple fix to Mahalanobis distance for improving near-OOD detection", 2021.
    MD_0 uses the mean and covariance of all (labelled) train rows, centred at the global mean.
    pytorch-ood's RMD builds the background covariance differently (see docs/detectors.md);
    this follows the paper. float32: see the module docstring.
    """

    label = "rMaha"

    relative = True


@register("mahalanobis_pp", tags=("paper21", "feature"), order=12)
class MahalanobisPP(_MahalanobisBase):
    """Mahalanobis++: Mahalanobis on l2-normalised features, train and test alike.

    Mueller & Hein, "Mahalanobis++: Improving OOD detection via feature normalization", ICML 2025.
    Invariant to rescaling any single sample; rows are normalised in float64. No hyperparameters.
    """

    label = "Maha++"

    normalise = True


@register("relative_mahalanobis_pp", tags=("paper21", "feature"), order=13)
class RelativeMahalanobisPP(_MahalanobisBase):
    """Relative Mahalanobis++: s = -min_c (MD_c(z/|z|) - MD_0(z/|z|)), all Gaussians fitted on
    l2-normalised ID-train features (Mueller & Hein, ICML 2025, applied to Ren et al. 2021).
    No hyperparameters."""

    label = "rMaha++"

    normalise = True
    relative = True
