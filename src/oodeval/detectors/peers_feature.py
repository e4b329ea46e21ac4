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
from sklearn.cluster import KMeans

from ..errors import InputError
from ..features import FeatureSet
from ..params import COMPUTE, POSITIVE, SEED, Integral, Interval, Options, Real
from . import register
from ._backend import Compute
from ._common import as64, chunks, class_means, l2_normalise, labelled, mean_rows, scatter
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


#: bank rows per block of relation's products (numpy, torch): a (512, 8192) float32 block per core
RELATION_BLOCK = {False: 8192, True: 65536}


@register("relation", tags=("hybrid",))
class Relation(PeerMethod):
    """Neural relation graph: s = sum_j r_j^pow [r_j > thres], r_j = max(0, <z^, z^_j>) <p, p_j>.

    Kim et al., "Neural relation graph: a unified framework for identifying label noise and
    outlier data", NeurIPS 2023 (OpenOOD's ``relation``). z^ = z / sqrt(|z|^2 + 1e-10), p =
    softmax(f), j over a bank of ID-train rows (``bank_fraction`` of them, seeded; default 1 =
    all of them, as the release); ``pow`` = 1 (``configs/postprocessors/relation.yml``) and
    ``thres`` = 0.03 (``relation_postprocessor.py``) are the release's defaults. The embeddings
    are formed in float64 and kept in ``compute_dtype`` (the bank: (D + C) values per row); the
    two products per (row, bank block) run in it and each row's sum accumulates in float64. In
    float32 an r_j moves by a few float32 ulps of the products (the rows are unit vectors and
    probabilities, so no offset or scale of the features enters), which changes a score only
    through a pair within that distance of ``thres``. ``device``: None = numpy, or a torch device.
    """

    needs = ("features", "logits")
    fit_needs = ("features", "logits")

    constraints = {"pow": POSITIVE, "thres": Interval(Real, None, None), "bank_fraction": Interval(Real, 0, 1, closed="right"), "seed": SEED, **COMPUTE}

    def __init__(self, pow: float = 1.0, thres: float = 0.03, bank_fraction: float = 1.0, seed: int = 0, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.pow = pow
        self.thres = thres
        self.bank_fraction = bank_fraction
        self.seed = seed
        self.compute_dtype = compute_dtype
        self.device = device

    @staticmethod
    def _embed(z: np.ndarray, f: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        z, f = as64(z), as64(f)
        p = np.exp(f - logsumexp(f, axis=1, keepdims=True))
        return z / np.sqrt((z**2).sum(1, keepdims=True) + 1e-10), p

    def _fit(self, train: FeatureSet) -> None:
        idx = _bank_rows(len(train), self.bank_fraction, self.seed, 1, "relation")
        n = len(train) if idx is None else len(idx)
        host = Compute(self.compute_dtype).dtype
        self.bank_features_ = np.empty((n, train.features.shape[1]), dtype=host)
        self.bank_probs_ = np.empty((n, train.logits.shape[1]), dtype=host)
        for sl in chunks(n, train.features.shape[1] + train.logits.shape[1]):
            rows = sl if idx is None else idx[sl]
            self.bank_features_[sl], self.bank_probs_[sl] = self._embed(train.features[rows], train.logits[rows])

    def _score(self, x: FeatureSet) -> np.ndarray:
        comp = self._compute()
        bank_z, bank_p = comp.put(self.bank_features_), comp.put(self.bank_probs_)
        step, thres, power = RELATION_BLOCK[comp.device is not None], float(self.thres), float(self.pow)

        def relation(z, p):
            total = 0.0
            for start in range(0, len(self.bank_features_), step):
                r = z @ bank_z[start : start + step].T
                r = r * (r > 0)
                r *= p @ bank_p[start : start + step].T
                r = r * (r > thres)
                total = total + comp.rowsum(r if power == 1 else r**power)
            return total

        out = np.empty(len(x))
        for sl in comp.chunks(len(x), self.bank_features_.shape[1] + self.bank_probs_.shape[1]):
            z, p = self._embed(x.features[sl], x.logits[sl])
            out[sl] = comp.get(comp.by_rows(relation, comp.put(z), comp.put(p)))
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


#: scikit-learn's GaussianMixture defaults, which OpenOOD's gmm runs with: the covariance
#: regulariser, the EM stopping change of the mean log-likelihood, the most EM steps
GMM_REG, GMM_TOL, GMM_MAX_ITER = 1e-6, 1e-3, 100
#: k-means (the EM's initialisation, scikit-learn's ``KMeans(n_init=1)``) runs at most this many
#: Lloyd steps
KMEANS_MAX_ITER = 300


def _refuse_over_budget(who: str, flop: float, budget_tflop: float, what: str, reduce: str) -> None:
    """InputError before any work when a fit or score would need more than ``budget_tflop`` TFLOP."""
    if flop > budget_tflop * 1e12:
        raise InputError(
            f"{who}: {what} would need up to {flop / 1e12:.3g} TFLOP (about {flop / 1e11 / 3600:.3g} h at "
            f"100 GFLOP/s), over budget_tflop={budget_tflop:g}; {reduce}, or raise budget_tflop"
        )


def _tied_log_density(x: np.ndarray, weights: np.ndarray, means: np.ndarray, prec_chol: np.ndarray) -> np.ndarray:
    """(N, K) log pi_k + log N(x | m_k, S), S^-1 = P P^T (P = ``prec_chol``), float64: one whitening
    product x P and the squared distances |xP - m_k P|^2 as one (N, K) product (scikit-learn
    whitens x once per component, K times the work)."""
    y = x @ prec_chol
    c = means @ prec_chol
    d2 = np.einsum("ij,ij->i", y, y)[:, None] - 2 * (y @ c.T) + np.einsum("ij,ij->i", c, c)[None, :]
    np.maximum(d2, 0.0, out=d2)
    log_det = np.log(np.diag(prec_chol)).sum()
    return np.log(weights)[None, :] + log_det - 0.5 * (x.shape[1] * np.log(2 * np.pi) + d2)


def _tied_parameters(xx: np.ndarray, nk: np.ndarray, sums: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """M-step of a tied-covariance mixture from the sufficient statistics (scikit-learn's formulas):
    weights nk / n, means sums / nk, S = (X^T X - sum_k nk m_k m_k^T) / n + reg I; returns the
    weights, the means and the precision's Cholesky factor P (S^-1 = P P^T)."""
    nk = nk + 10 * np.finfo(np.float64).eps
    means = sums / nk[:, None]
    cov = (xx - (nk[:, None] * means).T @ means) / nk.sum()
    cov.flat[:: cov.shape[0] + 1] += GMM_REG
    try:
        chol = scipy.linalg.cholesky(cov, lower=True)
    except np.linalg.LinAlgError:
        raise InputError(f"gmm: the tied covariance is singular; reduce dim (now {cov.shape[0]})") from None
    prec_chol = scipy.linalg.solve_triangular(chol, np.eye(len(cov)), lower=True).T
    return nk / nk.sum(), means, prec_chol


def tied_mixture(x: np.ndarray, k: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """EM for a K-component Gaussian mixture with one shared covariance on float64 rows ``x``, as
    scikit-learn's ``GaussianMixture(covariance_type="tied", random_state=seed)`` runs it: k-means
    labels (``KMeans(n_init=1, random_state=seed)``) start it, each step is an E-step then an M-step,
    and it stops once the mean log-likelihood changes by less than GMM_TOL (at most GMM_MAX_ITER
    steps). Each step is three products over row blocks (whitening, distances, responsibilities
    times rows: O(N D^2 + N K D), never the (N, K) responsibilities at once); X^T X is formed once.
    Returns the weights, means, precision Cholesky factor and the number of steps run."""
    n = len(x)
    labels = KMeans(n_clusters=k, n_init=1, random_state=seed).fit(x).labels_
    nk = np.bincount(labels, minlength=k).astype(np.float64)
    sums = np.zeros((k, x.shape[1]))
    np.add.at(sums, labels, x)
    xx = x.T @ x
    params = _tied_parameters(xx, nk, sums, n)
    lower = -np.inf
    for step in range(1, GMM_MAX_ITER + 1):
        nk, sums, total = np.zeros(k), np.zeros_like(sums), 0.0
        for sl in chunks(n, k + x.shape[1]):
            ll = _tied_log_density(x[sl], *params)
            norm = logsumexp(ll, axis=1)
            resp = np.exp(ll - norm[:, None])
            nk += resp.sum(0)
            sums += resp.T @ x[sl]
            total += norm.sum()
        params = _tied_parameters(xx, nk, sums, n)
        lower, change = total / n, total / n - lower
        if abs(change) < GMM_TOL:
            break
    return (*params, step)


@register("gmm", tags=("feature",))
class GMM(PeerMethod):
    """Gaussian mixture likelihood: s = log sum_k pi_k N(z P | m_k, S) (OpenOOD's ``gmm``).

    z P: the features projected on their top ``dim`` principal axes (P from the eigenvectors of
    the ID-train covariance, as OpenOOD's ``reduce_feature_dim("pca_50")`` with scikit-learn's
    PCA); a K = ``n_components`` mixture with one shared ("tied") covariance fitted on them by EM
    without labels (:func:`tied_mixture`: scikit-learn's ``GaussianMixture(covariance_type="tied",
    random_state=seed)`` algorithm, its reg_covar 1e-6, tol 1e-3, 100 steps, k-means start, on the
    BLAS in row blocks). Defaults are OpenOOD v1.5's ``configs/postprocessors/gmm.yml`` for the
    layer it scores (``num_clusters_list`` 50, ``reduce_dim_list`` pca_50, the last of its three
    layers, alpha [0, 0, 1]); ``dim=None`` fits on the full features. The release scores
    log(sum_k pi_k exp(-d_k^2 / 2) + 1e-40), this up to the Gaussian's constant where it does not
    underflow; its input perturbation (``noise``) needs the network and is not part of it. The
    fit costs O(N D^2) (the covariance) plus O(N (d^2 + K d)) per EM step (d the kept dimension);
    a fit whose worst case exceeds ``budget_tflop`` is refused before it starts. float64
    throughout.
    """

    needs = ("features",)
    fit_needs = ("features",)

    constraints = {"n_components": Interval(Integral, 1, None), "dim": (Interval(Integral, 1, None), None), "seed": SEED, "budget_tflop": POSITIVE}

    def __init__(self, n_components: int = 50, dim: int | None = 50, seed: int = 0, budget_tflop: float = 100.0) -> None:
        self.n_components = n_components
        self.dim = dim
        self.seed = seed
        self.budget_tflop = budget_tflop

    def _fit(self, train: FeatureSet) -> None:
        n, d = train.features.shape
        p = d if self.dim is None else min(int(self.dim), d)
        k = int(self.n_components)
        if k > n:
            raise InputError(f"gmm: n_components={k} exceeds the {n} ID-train rows")
        flop = 2 * n * d * d * (p < d) + 2 * n * (GMM_MAX_ITER * (p * p + 2 * k * p) + KMEANS_MAX_ITER * k * p)
        _refuse_over_budget("gmm", flop, self.budget_tflop, f"the fit ({n} rows, K={k}, dim {p})", "reduce n_components or dim")
        self.center_ = mean_rows(train.features)
        if p < d:
            s, _ = scatter(train.features, self.center_)
            evecs = np.linalg.eigh(s)[1]
            self.projection_ = np.ascontiguousarray(evecs[:, ::-1][:, :p])
        else:
            self.projection_ = None
        self.weights_, self.means_, self.prec_chol_, self.n_iter_ = tied_mixture(self._project(train.features), k, self.seed)
        self.resolved_ = {"dim": p}

    def _project(self, z: np.ndarray) -> np.ndarray:
        out = np.empty((len(z), len(self.center_) if self.projection_ is None else self.projection_.shape[1]))
        for sl in chunks(len(z), z.shape[1]):
            c = as64(z[sl]) - self.center_
            out[sl] = c if self.projection_ is None else c @ self.projection_
        return out

    def _score(self, x: FeatureSet) -> np.ndarray:
        out = np.empty(len(x))
        for sl in chunks(len(x), x.features.shape[1] + len(self.means_)):
            out[sl] = logsumexp(_tied_log_density(self._project(x.features[sl]), self.weights_, self.means_, self.prec_chol_), axis=1)
        return out


@register("class_gmm", tags=("feature",))
class ClassGMM(PeerMethod):
    """Class-conditional Gaussians with their own covariances: s = log sum_k pi_k N(z | m_k, S_k).

    m_k, S_k = the mean and maximum-likelihood covariance of the ID-train rows labelled k, plus
    ``reg`` I (default 1e-6, pytorch-ood 0.4's ``GMM(reg=1e-6)``), pi_k = their share of the
    labelled rows; the full log-likelihood, -(d_k^2 + log det S_k + D log 2 pi) / 2 + log pi_k,
    summed by log-sum-exp (pytorch-ood's ``GMM``; OpenOOD has no such method). float64 throughout:
    K Cholesky factors of D x D covariances (K D^2 floats) and, per scored row, K triangular
    solves (O(K D^2) each, a block of rows per BLAS call). A fit whose factors would exceed
    ``memory_gb``, and a fit or a score whose products would exceed ``budget_tflop``, are refused
    before they start (at K = 1000, D = 1024 the factors alone take 8.4 GB and 10^5 scored rows
    2 x 10^17 flop): reduce D (e.g. project the features) or the classes, or raise the limits.
    """

    needs = ("features",)
    fit_needs = ("features", "labels")

    constraints = {"reg": Interval(Real, 0, None), "memory_gb": POSITIVE, "budget_tflop": POSITIVE}

    def __init__(self, reg: float = 1e-6, memory_gb: float = 4.0, budget_tflop: float = 100.0) -> None:
        self.reg = reg
        self.memory_gb = memory_gb
        self.budget_tflop = budget_tflop

    def _fit(self, train: FeatureSet) -> None:
        y = np.asarray(train.labels)
        idx, classes = labelled(y, "class_gmm")
        n, d = idx.size, train.features.shape[1]
        need = classes.size * d * d * 8
        if need > self.memory_gb * 2**30:
            raise InputError(
                f"class_gmm: {classes.size} float64 {d} x {d} Cholesky factors need {need / 2**30:.1f} GiB, over "
                f"memory_gb={self.memory_gb:g}; reduce the feature dimension or the classes, or raise memory_gb"
            )
        _refuse_over_budget("class_gmm", 2 * n * d * d + classes.size * d**3, self.budget_tflop,
                            f"the fit ({n} rows, {classes.size} classes, D={d})", "reduce the feature dimension or the classes")  # fmt: skip
        self.means_, counts = class_means(train.features, y, classes)
        self.factors_ = np.empty((classes.size, d, d))
        self.log_norm_ = np.empty(classes.size)
        order = idx[np.argsort(y[idx], kind="stable")]
        ends = np.cumsum(counts.astype(int))
        for i, k in enumerate(classes):
            rows = order[ends[i] - int(counts[i]) : ends[i]]
            cov, _ = scatter(train.features[np.sort(rows)], self.means_[i])
            cov /= counts[i]
            cov.flat[:: d + 1] += self.reg
            try:
                self.factors_[i] = scipy.linalg.cholesky(cov, lower=True)
            except np.linalg.LinAlgError:
                raise InputError(f"class_gmm: the covariance of class {k} is singular; increase reg (now {self.reg})") from None
            log_det = 2 * np.log(np.diag(self.factors_[i])).sum()
            self.log_norm_[i] = np.log(counts[i] / n) - 0.5 * (log_det + d * np.log(2 * np.pi))

    def _score(self, x: FeatureSet) -> np.ndarray:
        k, d = self.factors_.shape[:2]
        _refuse_over_budget("class_gmm", k * len(x) * d * d, self.budget_tflop, f"scoring {len(x)} rows against {k} covariances of D={d}",
                            "score fewer rows at a time, reduce the feature dimension or the classes")  # fmt: skip
        out = np.empty(len(x))
        for sl in chunks(len(x), k + d):
            zt = as64(x.features[sl]).T
            ll = np.empty((zt.shape[1], k))
            for i, (m, factor) in enumerate(zip(self.means_, self.factors_)):
                w = scipy.linalg.solve_triangular(factor, zt - m[:, None], lower=True, check_finite=False)
                ll[:, i] = self.log_norm_[i] - 0.5 * np.einsum("ij,ij->j", w, w)
            out[sl] = logsumexp(ll, axis=1)
        return out
