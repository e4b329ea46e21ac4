"""The peers' feature detectors: Residual, SHE, Relation, NCI, GMM, class-conditional GMM.

Each reads the penultimate features z (N, D) (some also the logits or the head) and fits on the
ID-train set. Scores are float64, higher = more in-distribution. Where the peers (OpenOOD v1.5,
pytorch-ood 0.4) differ from each other or from the paper, docs/detectors.md ("The peers'
methods") says how.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
from scipy.special import logsumexp
from sklearn.mixture import GaussianMixture

from ..errors import InputError
from ..features import FeatureSet
from ..params import POSITIVE, SEED, Integral, Interval, Options, Real
from . import register
from ._common import as64, chunks, class_means, l2_normalise, labelled, mean_rows
from ._peers import PeerMethod
from .hybrid import ViM
from .neighbours import _bank_rows

__all__ = ["Residual", "SHE", "Relation", "NCI", "GMM", "ClassGMM"]


@register("residual", tags=("feature",))
class Residual(PeerMethod, ViM):
    """Residual: s = -||(z - u) R||, ViM's virtual logit alone (Wang et al., CVPR 2022, Sec. 5).

    u = -pinv(W) b, R the eigenvectors of the uncentred covariance of (z - u) over ID train
    beyond the top ``dim`` (ViM's fit, :class:`~oodeval.detectors.hybrid.ViM`). ``dim`` defaults
    to ViM's rule (1000 if D >= 2048, 512 if D >= 768, else D / 2), as the paper's Residual
    baseline shares ViM's D'; OpenOOD's ``residual.yml`` sets 512 for every network (which
    leaves a 512-d feature no residual) and fits on its ID ``val`` split, here the ID-train set.
    float64 throughout (the residual space is the covariance's smallest eigenvalues).
    """

    constraints = {"dim": (Interval(Integral, 1, None), None)}

    def __init__(self, dim: int | None = None) -> None:
        self.dim = dim

    def _score(self, x: FeatureSet) -> np.ndarray:
        return -self.residual_norm(x.features)


_SHE_METRICS = ("inner_product", "euclidean", "cosine")


@register("she", tags=("feature",))
class SHE(PeerMethod):
    """Simplified Hopfield energy: s = <z, S_y>, y = argmax f, S_k the mean ID-train feature of
    the rows labelled k and predicted k (Zhang et al., "OOD detection based on in-distribution
    data patterns memorization with modern Hopfield energy", ICLR 2023).

    ``metric`` "inner_product" (default, both releases), or OpenOOD's alternatives "euclidean"
    (-||z - S_y||) and "cosine". A class without a correctly classified ID-train row takes the
    mean of its labelled rows as its pattern (OpenOOD's mean is then NaN, pytorch-ood refuses).
    float64 throughout.
    """

    needs = ("features", "logits")
    fit_needs = ("features", "logits", "labels")

    constraints = {"metric": Options(*_SHE_METRICS)}

    def __init__(self, metric: str = "inner_product") -> None:
        self.metric = metric

    def _fit(self, train: FeatureSet) -> None:
        y = np.asarray(train.labels)
        _, classes = labelled(y, "she")
        pred = np.concatenate([as64(train.logits[sl]).argmax(1) for sl in chunks(len(y), train.logits.shape[1])])
        correct = np.where(pred == y, y, -1)
        patterns = np.zeros((train.logits.shape[1], train.features.shape[1]))
        have = np.unique(correct[correct >= 0])
        if have.size:
            patterns[have] = class_means(train.features, correct, have)[0]
        rest = np.setdiff1d(classes, have)
        if rest.size:
            patterns[rest] = class_means(train.features, np.where(np.isin(y, rest), y, -1), rest)[0]
        self.patterns_ = patterns

    def _score(self, x: FeatureSet) -> np.ndarray:
        out = np.empty(len(x))
        for sl in chunks(len(x), x.features.shape[1]):
            z = as64(x.features[sl])
            s = self.patterns_[as64(x.logits[sl]).argmax(1)]
            if self.metric == "inner_product":
                out[sl] = np.einsum("ij,ij->i", z, s)
            elif self.metric == "euclidean":
                out[sl] = -np.linalg.norm(z - s, axis=1)
            else:
                out[sl] = np.einsum("ij,ij->i", l2_normalise(z), l2_normalise(s))
        return out


@register("relation", tags=("hybrid",))
class Relation(PeerMethod):
    """Neural relation graph: s = sum_j r_j^pow [r_j > thres], r_j = max(0, <z^, z^_j>) <p, p_j>.

    Kim et al., "Neural relation graph: a unified framework for identifying label noise and
    outlier data", NeurIPS 2023 (OpenOOD's ``relation``). z^ = z / sqrt(|z|^2 + 1e-10), p =
    softmax(f), j over a bank of ID-train rows (``bank_fraction`` of them, seeded; default 1 =
    all of them, as the release); ``pow`` = 1 and ``thres`` = 0.03 are the release's defaults.
    float64 throughout; the bank holds (D + C) float64 values per row, so for ImageNet-sized
    training sets a ``bank_fraction`` below 1 keeps it in memory (the release holds all of it).
    """

    needs = ("features", "logits")
    fit_needs = ("features", "logits")

    constraints = {"pow": POSITIVE, "thres": Interval(Real, None, None), "bank_fraction": Interval(Real, 0, 1, closed="right"), "seed": SEED}

    def __init__(self, pow: float = 1.0, thres: float = 0.03, bank_fraction: float = 1.0, seed: int = 0) -> None:
        self.pow = pow
        self.thres = thres
        self.bank_fraction = bank_fraction
        self.seed = seed

    @staticmethod
    def _embed(z: np.ndarray, f: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        z, f = as64(z), as64(f)
        p = np.exp(f - logsumexp(f, axis=1, keepdims=True))
        return z / np.sqrt((z**2).sum(1, keepdims=True) + 1e-10), p

    def _fit(self, train: FeatureSet) -> None:
        idx = _bank_rows(len(train), self.bank_fraction, self.seed, 1, "relation")
        rows = np.arange(len(train)) if idx is None else idx
        self.bank_features_, self.bank_probs_ = self._embed(train.features[rows], train.logits[rows])

    def _score(self, x: FeatureSet) -> np.ndarray:
        out = np.empty(len(x))
        step = 4096
        for sl in chunks(len(x), len(self.bank_features_)):
            z, p = self._embed(x.features[sl], x.logits[sl])
            total = np.zeros(len(z))
            for start in range(0, len(self.bank_features_), step):
                rel = np.maximum(z @ self.bank_features_[start : start + step].T, 0.0)
                rel *= p @ self.bank_probs_[start : start + step].T
                total += np.where(rel > self.thres, rel**self.pow, 0.0).sum(1)
            out[sl] = total
        return out


@register("nci", tags=("hybrid",))
class NCI(PeerMethod):
    """Neural-collapse inspired: s = <w_y, z - mu> / ||z - mu|| + alpha ||z||_1, y = argmax f.

    Liu & Qin, "Detecting out-of-distribution through the lens of neural collapse", CVPR 2025.
    mu = the mean ID-train feature, w_y the head's row of the predicted class. ``alpha`` =
    1e-4 is OpenOOD's default (``nci.yml``; pytorch-ood's is 0, which drops the norm term).
    """

    needs = ("features", "logits", "head")
    fit_needs = ("features",)

    constraints = {"alpha": Interval(Real, None, None)}

    def __init__(self, alpha: float = 1e-4) -> None:
        self.alpha = alpha

    def _fit(self, train: FeatureSet) -> None:
        self.train_mean_ = mean_rows(train.features)

    def _score(self, x: FeatureSet) -> np.ndarray:
        w = as64(x.weight)
        out = np.empty(len(x))
        for sl in chunks(len(x), x.features.shape[1]):
            z = as64(x.features[sl])
            c = z - self.train_mean_
            wy = w[as64(x.logits[sl]).argmax(1)]
            out[sl] = np.einsum("ij,ij->i", wy, c) / np.linalg.norm(c, axis=1) + self.alpha * np.abs(z).sum(1)
        return out


@register("gmm", tags=("feature",))
class GMM(PeerMethod):
    """Gaussian mixture likelihood: s = log sum_k pi_k N(z | m_k, S) (OpenOOD's ``gmm``).

    A K-component mixture with one shared ("tied") covariance fitted by EM on the ID-train
    features, without labels: scikit-learn's ``GaussianMixture(covariance_type="tied",
    random_state=seed)``, as the release (its ``reg_covar`` 1e-6, 100 EM steps). K =
    ``n_components``, default the number of ID classes. The release scores log(sum_k pi_k
    exp(-d_k^2 / 2) + 1e-40), which is this up to a constant where it does not underflow; its
    input perturbation (``noise``) and layer ensemble need the network and are not part of it.
    EM over the whole ID-train set costs O(N K D^2) per step (scikit-learn, float64).
    """

    needs = ("features",)
    fit_needs = ("features", "labels")

    constraints = {"n_components": (Interval(Integral, 1, None), None), "seed": SEED}

    def __init__(self, n_components: int | None = None, seed: int = 0) -> None:
        self.n_components = n_components
        self.seed = seed

    def _fit(self, train: FeatureSet) -> None:
        _, classes = labelled(train.labels, "gmm")
        k = classes.size if self.n_components is None else int(self.n_components)
        self.mixture_ = GaussianMixture(n_components=k, covariance_type="tied", random_state=self.seed)
        self.mixture_.fit(as64(train.features))
        self.resolved_ = {"n_components": k}

    def _score(self, x: FeatureSet) -> np.ndarray:
        return np.concatenate([self.mixture_.score_samples(as64(x.features[sl])) for sl in chunks(len(x), x.features.shape[1])])


@register("class_gmm", tags=("feature",))
class ClassGMM(PeerMethod):
    """Class-conditional Gaussians with their own covariances: s = log sum_k pi_k N(z | m_k, S_k).

    m_k, S_k = the mean and maximum-likelihood covariance of the ID-train rows labelled k, plus
    ``reg`` I (default 1e-6, pytorch-ood's), pi_k = their share of the labelled rows; the full
    log-likelihood, -(d_k^2 + log det S_k + D log 2 pi) / 2 + log pi_k, summed by log-sum-exp
    (pytorch-ood's ``GMM``). float64 throughout (Cholesky factors of every S_k).
    """

    needs = ("features",)
    fit_needs = ("features", "labels")

    constraints = {"reg": Interval(Real, 0, None)}

    def __init__(self, reg: float = 1e-6) -> None:
        self.reg = reg

    def _fit(self, train: FeatureSet) -> None:
        y = np.asarray(train.labels)
        idx, classes = labelled(y, "class_gmm")
        z, y = as64(train.features[idx]), y[idx]
        d = z.shape[1]
        self.means_ = np.empty((classes.size, d))
        self.factors_ = np.empty((classes.size, d, d))
        self.log_norm_ = np.empty(classes.size)
        for i, k in enumerate(classes):
            zk = z[y == k]
            self.means_[i] = zk.mean(0)
            c = zk - self.means_[i]
            cov = c.T @ c / len(zk) + self.reg * np.eye(d)
            try:
                self.factors_[i] = scipy.linalg.cholesky(cov, lower=True)
            except np.linalg.LinAlgError:
                raise InputError(f"class_gmm: the covariance of class {k} is singular; increase reg (now {self.reg})") from None
            log_det = 2 * np.log(np.diag(self.factors_[i])).sum()
            self.log_norm_[i] = np.log(len(zk) / len(z)) - 0.5 * (log_det + d * np.log(2 * np.pi))

    def _score(self, x: FeatureSet) -> np.ndarray:
        out = np.empty(len(x))
        for sl in chunks(len(x), x.features.shape[1]):
            z = as64(x.features[sl])
            ll = np.empty((len(z), len(self.means_)))
            for i, (m, factor) in enumerate(zip(self.means_, self.factors_)):
                w = scipy.linalg.solve_triangular(factor, (z - m).T, lower=True)
                ll[:, i] = self.log_norm_[i] - 0.5 * (w**2).sum(0)
            out[sl] = logsumexp(ll, axis=1)
        return out
