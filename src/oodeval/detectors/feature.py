"""Feature-based detectors reading class centroids or decision geometry: cosine, MCM, fDBD, NECO.

(The Mahalanobis family and kNN, also feature-based, live in mahalanobis.py and neighbours.py;
NAC in nac.py.)
"""

from __future__ import annotations

import numpy as np
from scipy.special import softmax

from ..features import FeatureSet
from . import register
from ._common import as64, chunks, class_means, head_logits, l2_normalise, labelled, mean_rows, scatter
from .base import Detector

__all__ = ["Cosine", "MCM", "FDBD", "NECO"]


class _CentroidBase(Detector):
    needs = ("features",)
    fit_needs = ("features", "labels")

    def _fit(self, train: FeatureSet) -> None:
        _, self.classes_ = labelled(train.labels, type(self).__name__)
        means, _ = class_means(train.features, train.labels, self.classes_)
        self.centroids_ = l2_normalise(means)

    def _cosines(self, x: FeatureSet):
        z = x.features
        for sl in chunks(len(z), max(z.shape[1], len(self.centroids_))):
            yield l2_normalise(as64(z[sl])) @ self.centroids_.T


@register("cosine")
class Cosine(_CentroidBase):
    """s = max_c cos(z, mu_c), mu_c the mean ID-train feature of class c (true labels).

    The class-centroid counterpart of a CLIP zero-shot max-similarity score (Fi-ImageNet-1k
    paper Sec. 2.1, following NINCO, Bitterwolf et al. 2023). Centroids are means of the raw
    features. No hyperparameters.
    """

    def _score(self, x: FeatureSet) -> np.ndarray:
        return np.concatenate([c.max(axis=1) for c in self._cosines(x)])


@register("mcm")
class MCM(_CentroidBase):
    """s = max_c softmax_c(cos(z, mu_c) / T), the class-centroid form of MCM.

    Ming et al., "Delving into OOD detection with vision-language representations" (MCM),
    NeurIPS 2022, applied to ID-train class-mean features instead of text embeddings
    (Fi-ImageNet-1k paper Sec. 2.1). Default T = 1 (DESIGN.md).
    """

    def __init__(self, t: float = 1.0) -> None:
        self.t = t

    def _score(self, x: FeatureSet) -> np.ndarray:
        if not self.t > 0:
            raise ValueError(f"mcm temperature t must be > 0, got {self.t}")
        return np.concatenate([softmax(c / self.t, axis=1).max(axis=1) for c in self._cosines(x)])


@register("fdbd")
class FDBD(Detector):
    """fDBD: mean feature distance to the decision boundaries, regularised by the feature norm.

    Liu & Qin, "Fast decision boundary based OOD detector", ICML 2024:
    s = 1/(C-1) sum_{c != y} |f_y - f_c| / ||w_y - w_c||  /  ||z - zbar||,
    f = W z + b, y = argmax f, zbar the mean ID-train feature (the release's default
    regulariser). No hyperparameters.
    """

    needs = ("features", "head")
    fit_needs = ("features", "head")

    def _fit(self, train: FeatureSet) -> None:
        self.train_mean_ = mean_rows(train.features)
        w = as64(train.weight)
        sq = np.einsum("cd,cd->c", w, w)
        dist = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2.0 * (w @ w.T), 0.0))
        np.fill_diagonal(dist, np.inf)
        if not (dist > 0).all():
            raise ValueError("fdbd: two classes of the head have identical weight vectors")
        self.inv_boundary_norm_ = 1.0 / dist

    def _score(self, x: FeatureSet) -> np.ndarray:
        z = x.features
        c = x.weight.shape[0]
        if self.inv_boundary_norm_.shape != (c, c):
            raise ValueError(f"fdbd was fitted with {len(self.inv_boundary_norm_)} classes, got {c}")
        out = []
        for sl in chunks(len(z), max(z.shape[1], c)):
            zc = as64(z[sl])
            f = head_logits(zc, x.weight, x.bias)
            y = f.argmax(axis=1)
            gap = np.abs(f[np.arange(len(f)), y][:, None] - f)
            dist = (gap * self.inv_boundary_norm_[y]).sum(axis=1) / (c - 1)
            out.append(dist / np.linalg.norm(zc - self.train_mean_, axis=1))
        return np.concatenate(out)


@register("neco")
class NECO(Detector):
    """NECO: s = ||P_d x|| / ||x||, x the standardised feature, P_d the top-d PCA projection.

    Ben Ammar et al., "NECO: Neural collapse based OOD detection", ICLR 2024. Standardisation
    (per-dimension ID-train mean and std, as sklearn's StandardScaler; zero-variance dimensions
    keep scale 1) is applied to train and test alike; PCA = eigh of the covariance of the
    standardised train features. d: the smallest number of components explaining at least
    ``variance`` (default 0.9) of the variance, unless ``dim`` is given. ``maxlogit=True``
    multiplies by max_c f_c, which the release does for every non-ResNet backbone (ViT, DeiT,
    Swin); needs logits then. The class default is off (the paper's formula);
    :func:`oodeval.detectors.defaults.resolve_defaults` turns it on for non-ResNet backbones.
    The release's denominator for DeiT/Swin uses the raw feature norm; we keep the standardised
    norm for every backbone (the paper's formula).
    """

    needs = ("features",)
    fit_needs = ("features",)

    def __init__(self, variance: float = 0.9, dim: int | None = None, maxlogit: bool = False) -> None:
        self.variance = variance
        self.dim = dim
        self.maxlogit = maxlogit

    def _fit(self, train: FeatureSet) -> None:
        z = train.features
        self.mean_ = mean_rows(z)
        s, n = scatter(z, self.mean_)
        var = np.diag(s) / n
        self.scale_ = np.where(var > 0, np.sqrt(var), 1.0)
        corr = s / n / np.outer(self.scale_, self.scale_)
        evals, evecs = np.linalg.eigh(corr)
        order = np.argsort(evals)[::-1]
        evals, evecs = np.maximum(evals[order], 0.0), evecs[:, order]
        self.explained_variance_ratio_ = evals / evals.sum()
        if self.dim is not None:
            if not 1 <= int(self.dim) <= z.shape[1]:
                raise ValueError(f"neco dim must be in [1, {z.shape[1]}], got {self.dim}")
            d = int(self.dim)
        else:
            if not 0 < self.variance <= 1:
                raise ValueError(f"neco variance must be in (0, 1], got {self.variance}")
            cum = np.cumsum(self.explained_variance_ratio_)
            d = int(min(np.searchsorted(cum, self.variance - 1e-12) + 1, z.shape[1]))
        self.n_components_ = d
        self.components_ = evecs[:, :d]

    def _score(self, x: FeatureSet) -> np.ndarray:
        if self.maxlogit:
            x.require(("logits",), "neco(maxlogit=True)")
        z = x.features
        out = []
        for sl in chunks(len(z), z.shape[1]):
            s = (as64(z[sl]) - self.mean_) / self.scale_
            ratio = np.linalg.norm(s @ self.components_, axis=1) / np.linalg.norm(s, axis=1)
            if self.maxlogit:
                ratio = ratio * as64(x.logits[sl]).max(axis=1)
            out.append(ratio)
        return np.concatenate(out)
