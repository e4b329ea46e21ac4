"""The Mahalanobis family: Mahalanobis, relative Mahalanobis, and their ++ (l2-normalised) forms.

Class-conditional Gaussians with one shared covariance S fitted on ID-train features with their
true labels (rows labelled -1 are ignored). eigh is float64. On the float32 path, on fits of at
least :data:`SCATTER_MIN_CHUNKS` row chunks, the class means are float32 sums of rows centred at
a float32 reference, added into float64 (:func:`_centred_class_means`), and the scatter of the
class-centred rows is float32 products of centred blocks added into float64: both kept only where the scatter's
expected rounding read through the whitening
(:func:`~._common.scatter_rounding`) is at most :data:`SCATTER_ROUNDING_LIMIT`; else (a
covariance conditioned beyond ~1e5, a rank-deficient one: the inverse reads eigenvalues a float32
sum cannot resolve) both are formed again in float64 (``scatter_dtype_`` says which), as they always
are on the float64 path. S^+ = W W^T with
W = V_k L_k^-1/2 over the eigenvalues above numpy's pseudo-inverse cutoff (max(D) eps of the
largest), so every distance is a squared norm in whitened, centred coordinates:

    (z - mu_c)' S^+ (z - mu_c) = ||u - nu_c||^2,  u = (z - m) W,  nu_c = (mu_c - m) W,

m the ID-train mean rounded to float32 (z - m is then rounded relative to itself, not to |m|). ``compute_dtype="float32"`` (default)
runs u = (z - m) W, the class means' nu = (mu - m) W and the (N, C) cross term u nu^T as sgemm
and sums ||u||^2 and ||nu_c||^2 in float64; its
error is a few float32 ulps of ||u||^2 + ||nu_c||^2, in units where the ID distances are about
the rank k: it does not grow with the features' offset or scale (both removed before any float32
rounding), and with the conditioning only as the rounding of z - m read through W. Where that
rounding's expected size exceeds :data:`WHITENED_ROUNDING_LIMIT` (a covariance conditioned far
beyond 1e8), the fit switches the detector to float64 and says so in ``resolved_`` (the results'
``hyperparameters_resolved``). ``"float64"``: all in float64.
``device``: None = numpy, or a torch device; see ``_backend``.

The peers' Gaussian mixtures follow (opt-in, float64): GMM (OpenOOD's tied-covariance mixture on
PCA axes, fitted by EM without labels) and the class-conditional GMM with a covariance per class
(pytorch-ood's), each refusing up front a size beyond its ``budget_tflop`` / ``memory_gb``.
"""

from __future__ import annotations

import contextlib

import numpy as np
import scipy.linalg
import scipy.sparse
from scipy.special import logsumexp
from sklearn.cluster import KMeans
from threadpoolctl import threadpool_limits

from ..errors import InputError
from ..features import FeatureSet
from ..params import COMPUTE, POSITIVE, SEED, Integral, Interval, Real
from . import register
from ._backend import Compute
from ._common import as64, chunks, class_means, eigh_one_thread, float32_centre, labelled, labelled_chunks, mean_rows, scatter, scatter_rounding, whitening
from .base import Detector, OptInDetector

#: largest expected norm of the float32 rounding of z - m read through the whitening W (eps32
#: times the rms of z - m times ||W||_F, :func:`_whitened_rounding`) for which the float32 path
#: runs: a distance's error is then about sqrt(2) times this of the ID distances' spread, 3e-3 (the
#: conditioned problems of tests/test_detectors_precision.py reach 6e-4 at condition number 1e8,
#: Spearman 1.000000); above it the detector computes in float64 and records that in ``resolved_``
WHITENED_ROUNDING_LIMIT = 2e-3
#: largest expected norm of what the float32 scatter's rounding adds to the whitened covariance
#: (:func:`~oodeval.detectors._common.scatter_rounding`, an estimate 60-1000 times above what
#: the conditioned problems showed) for which the float32 path keeps its float32 scatter; above
#: it (a covariance conditioned beyond ~1e5, a rank-deficient one) the fit forms the scatter
#: again in float64 (``scatter_dtype_`` says which it kept)
SCATTER_ROUNDING_LIMIT = 2e-3
#: the float32 scatter runs only on at least this many row chunks (16384 rows at D = 1024): its
#: running sums' errors average over independent chunks, and on one chunk they did not enough (the
#: quick demo's 1200 x 96 real features: scores moved by 1.4e-5 of their scale, 3x the goldens'
#: tolerance, tests/test_golden.py); a fit that small keeps the float64 scatter
SCATTER_MIN_CHUNKS = 4

__all__ = ["Mahalanobis", "RelativeMahalanobis", "MahalanobisPP", "RelativeMahalanobisPP", "GMM", "ClassGMM", "tied_mixture"]


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
        device = self._compute().device
        stats = Compute("float64", device)
        idx, classes = labelled(train.labels, who)
        self.classes_ = classes
        comp = Compute(self.compute_dtype, device)
        chunk = comp.rows(train.features.shape[1])
        fast = self.compute_dtype == "float32" and idx.size >= SCATTER_MIN_CHUNKS * chunk
        comp = comp if fast else stats
        mean = self._statistics(train, classes, comp)
        self.scatter_rounding_ = None  # the float32 scatter's estimate, where one was formed
        if fast:
            self.scatter_rounding_ = scatter_rounding(self.covariance_, self.means_, self.counts_, self._whitenings(), chunk, self.normalise)
            if self.scatter_rounding_ > SCATTER_ROUNDING_LIMIT or self.whitened_rounding_ > WHITENED_ROUNDING_LIMIT:
                mean = self._statistics(train, classes, stats)
                fast = False
        self.scatter_dtype_ = "float32" if fast else "float64"
        if self.compute_dtype == "float32" and self.whitened_rounding_ > WHITENED_ROUNDING_LIMIT:
            self.resolved_ = {"compute_dtype": "float64"}
        # nu_c = (mu_c - m) W in the scoring's precision, as each scored row's u = (z - m) W (mu_c - m
        # rounded once, relative to itself; one product); ||nu_c||^2 summed in float64
        comp = self._compute()
        self.whitened_means_ = comp.get(comp.put(self.means_ - self.center_) @ comp.put(self.whitening_))
        self.whitened_mean_norms_ = np.einsum("ck,ck->c", self.whitened_means_, self.whitened_means_)
        if self.relative:
            self.background_offset_ = (mean - self.center_) @ self.background_whitening_

    def _statistics(self, train: FeatureSet, classes: np.ndarray, comp: Compute) -> np.ndarray:
        """The class means and counts, the ID-train mean's float32 centre, the covariances and
        their whitenings (and ``whitened_rounding_``), in ``comp``'s precision (float32:
        :func:`_centred_class_means` and the float32 scatter); returns the ID-train mean
        (count-weighted class means)."""
        if comp.precision == "float32":
            self.means_, self.counts_ = _centred_class_means(train.features, train.labels, classes, self.normalise, comp)
        else:
            self.means_, self.counts_ = class_means(train.features, train.labels, classes, self.normalise, comp)
        mean = self.counts_ @ self.means_ / self.counts_.sum()
        # the ID-train mean rounded to float32: the centre of every whitened coordinate
        self.center_ = float32_centre(mean)
        s, _ = scatter(train.features, self.means_, train.labels, classes, self.normalise, comp)
        self._whiten(s, mean)
        self.whitened_rounding_ = _whitened_rounding(self.covariance_, self.means_ - self.center_, self.counts_, self._whitenings())
        return mean

    def _whiten(self, s: np.ndarray, mean: np.ndarray) -> None:
        """The covariance and its whitening from the within-class scatter ``s``; the relative forms
        also the background Gaussian's, on all labelled rows centred at their mean ``mean``:
        scatter = within-class scatter + between-class scatter (an exact identity, no third
        pass); its whitened coordinates are (z - center_) W_0 - background_offset_."""
        n = self.counts_.sum()
        self.covariance_ = s / n
        self.whitening_ = whitening(self.covariance_)
        if self.relative:
            between = (self.means_ - mean) * np.sqrt(self.counts_)[:, None]
            self.background_covariance_ = (s + between.T @ between) / n
            self.background_whitening_ = whitening(self.background_covariance_)

    def _whitenings(self) -> list:
        return [self.whitening_] + ([self.background_whitening_] if self.relative else [])

    def _score(self, x: FeatureSet) -> np.ndarray:
        """-min_c ||u - nu_c||^2 = -(||u||^2 + min_c (||nu_c||^2 - 2 u nu_c)), u = (z - m) W; the
        relative forms add ||(z - m) W_0||^2. z - m is one subtraction in the product precision
        (m float32-representable: an error relative to z - m); the ++ forms normalise and centre
        each row in float64 first (:meth:`Compute.centred_unit`: a normalised row's rounding would
        be relative to |z / |z||)."""
        z = x.features
        if z.shape[1] != self.means_.shape[1]:
            raise InputError(f"{type(self).__name__} was fitted on {self.means_.shape[1]}-d features, got {z.shape[1]}")
        comp = self._compute()
        # -2 nu_c: the cross term's factor folded into the product (a power of two: exact)
        white, nu = comp.put(self.whitening_), comp.put(-2.0 * self.whitened_means_).T
        const, center = comp.put(self.whitened_mean_norms_), comp.put(self.center_, "float64" if self.normalise else None)
        if self.relative:
            bg_white, bg_offset = comp.put(self.background_whitening_), comp.put(self.background_offset_)

        def block(c):
            r = comp.centred_unit(c, center) if self.normalise else comp.centred(c, center)
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

        return comp.map_rows(block, z, width=max(z.shape[1], len(self.means_)))


def _centred_class_means(features: np.ndarray, labels: np.ndarray, classes: np.ndarray, normalise: bool, comp: Compute) -> tuple[np.ndarray, np.ndarray]:
    """Class means (K, D) float64 and counts as :func:`~._common.class_means`, from float32 sums
    of centred rows: mu_c = r + sum_{y_i = c} (z_i - r) / n_c, r the first chunk's mean row
    rounded to float32. z - r is one float32 subtraction (rounded relative to z - r, never to
    |z|; the ++ forms take z / |z| - r in float64 and round it once); each chunk's class sums are
    one float32 sparse product (a few rows per class) added into float64. The error is then a few
    float32 ulps of the rows' spread about r, below each scored row's own rounding of z - m, where
    a float32 sum of the raw rows would err by ulps of |z| (the features' offset)."""
    d = features.shape[1]
    sums, counts, ref, work = comp.zeros((classes.size, d)), np.zeros(classes.size), None, None
    for rows, y in labelled_chunks(features, labels, comp):
        if ref is None:
            first = comp.normalise(comp.put(rows, "float64")) if normalise else comp.put(rows)
            ref = float32_centre(comp.get(comp.colsum(first)) / len(rows))
            centre = comp.put(ref, "float64" if normalise else None)
        if normalise:
            z = comp.centred_unit(rows, centre)
        else:
            work = comp.empty((comp.rows(d), d)) if work is None else work  # one buffer for every chunk
            z = comp.subtract(comp.put(rows), centre, out=work[: len(rows)])
        group = np.searchsorted(classes, y)
        sums += comp.groupsum(z, group, classes.size)
        counts += np.bincount(group, minlength=classes.size)
    if (counts == 0).any():
        raise InputError(f"{int((counts == 0).sum())} of {classes.size} classes have no training rows")
    return ref + comp.get(sums) / counts[:, None], counts


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


#: scikit-learn's GaussianMixture defaults, which OpenOOD's gmm runs with: the covariance
#: regulariser, the EM stopping change of the mean log-likelihood, the most EM steps
GMM_REG, GMM_TOL, GMM_MAX_ITER = 1e-6, 1e-3, 100


#: k-means (the EM's initialisation, scikit-learn's ``KMeans(n_init=1)``) runs at most this many
#: Lloyd steps
KMEANS_MAX_ITER = 300
#: the widest feature dimension whose EM (and k-means) runs on one thread
NARROW_EM = 256


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


def tied_mixture(x: np.ndarray, k: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """EM for a K-component Gaussian mixture with one shared covariance on float64 rows ``x``, as
    scikit-learn's ``GaussianMixture(covariance_type="tied", random_state=seed)`` runs it: k-means
    labels (``KMeans(n_init=1, random_state=seed)``) start it, each step is an E-step then an M-step,
    and it stops once the mean log-likelihood changes by less than GMM_TOL (at most GMM_MAX_ITER
    steps). Each step is three products over row blocks (whitening, distances, responsibilities
    times rows: O(N D^2 + N K D), never the (N, K) responsibilities at once); X^T X is formed once.
    Returns the weights, means, precision Cholesky factor, the number of EM steps run and the
    number of k-means (Lloyd) steps of its start."""
    # products of a few dozen columns gain nothing from BLAS's and OpenMP's threads, whose waits
    # cost up to 6x the CPU time on a busy machine (measured: 8.6 s against 1.5 s of CPU for this
    # EM at N = 20000, d = K = 50, one thread each), so narrow fits run on one thread
    with threadpool_limits(1) if x.shape[1] <= NARROW_EM else contextlib.nullcontext():
        return _tied_em(x, k, seed)


def _tied_em(x: np.ndarray, k: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    n = len(x)
    start = KMeans(n_clusters=k, n_init=1, random_state=seed).fit(x)
    labels = start.labels_
    nk = np.bincount(labels, minlength=k).astype(np.float64)
    sums = scipy.sparse.csr_matrix((np.ones(n), (labels, np.arange(n))), shape=(k, n)) @ x
    xx = x.T @ x
    params = _tied_parameters(xx, nk, sums, n)
    lower = -np.inf
    for step in range(1, GMM_MAX_ITER + 1):
        nk, sums, total = np.zeros(k), np.zeros_like(sums), 0.0
        for sl in chunks(n, k + x.shape[1]):
            ll = _tied_log_density(x[sl], *params)
            top = ll.max(1, keepdims=True)
            resp = np.exp(ll - top)
            mass = resp.sum(1, keepdims=True)
            resp /= mass
            norm = top[:, 0] + np.log(mass[:, 0])
            nk += resp.sum(0)
            sums += resp.T @ x[sl]
            total += norm.sum()
        params = _tied_parameters(xx, nk, sums, n)
        lower, change = total / n, total / n - lower
        if abs(change) < GMM_TOL:
            break
    return (*params, step, int(start.n_iter_))


@register("gmm", tags=("feature",))
class GMM(OptInDetector):
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
            evecs = eigh_one_thread(s)[1][:, d - p :]  # the p largest, ascending
            self.projection_ = np.ascontiguousarray(evecs[:, ::-1])
        else:
            self.projection_ = None
        self.weights_, self.means_, self.prec_chol_, self.n_iter_, self.kmeans_iter_ = tied_mixture(self._project(train.features), k, self.seed)
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
class ClassGMM(OptInDetector):
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
