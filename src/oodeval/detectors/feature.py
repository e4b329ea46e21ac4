"""Feature-based detectors reading class centroids or decision geometry: cosine, MCM, fDBD, NECO.

(The Mahalanobis family and kNN, also feature-based, live in mahalanobis.py and neighbours.py;
NAC in nac.py.) Each takes ``compute_dtype`` ("float32" products with float64 sums, the default, or
"float64") and ``device`` (None = numpy, or a torch device); see ``_backend``. float32 guarantees
(eps = 2^-24): cosine and MCM multiply z - m (m the ID-train mean rounded to float32, so the
difference is rounded relative to itself) and add m mu_c computed in float64, so a cosine is off by about sqrt(D) eps |z - m| / |z| plus one rounding,
not by the size of an offset all features share; NECO standardises as ((z - m32) - rest) / s
(:func:`~oodeval.detectors._common.centre_parts`: each step rounded relative to its result) and
projects in float32 (relative error about sqrt(D) eps, independent of offset and scale); fDBD's
logits are one sgemm (error about sqrt(D) eps |w_c| |z|), its ||z - zbar|| centred the same way.

The peers' SHE (class patterns read by the predicted class, opt-in, float64) follows.
"""

from __future__ import annotations

import numpy as np
from ..errors import InputError
from ..features import FeatureSet
from ..params import BOOLEAN, COMPUTE, POSITIVE, SEED, Integral, Interval, Options, Real
from . import register
from ._backend import Compute, one_blas_thread
from ._common import as64, centre_parts, class_means, eigh_one_thread, float32_centre, l2_normalise, labelled, mean_rows, scatter
from .base import BackboneInfo, Default, Detector, OptInDetector

__all__ = ["Cosine", "MCM", "FDBD", "NECO", "SHE", "KernelPCA", "ORA"]


class _CentroidBase(Detector):
    needs = ("features",)
    fit_needs = ("features", "labels")

    constraints = COMPUTE

    def __init__(self, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.compute_dtype = compute_dtype
        self.device = device

    def _fit(self, train: FeatureSet) -> None:
        _, self.classes_ = labelled(train.labels, type(self).__name__)
        means, counts = class_means(train.features, train.labels, self.classes_, comp=self._compute())
        self.centroids_ = l2_normalise(means)
        with one_blas_thread():  # two (K, D) matrix-vector products: a second BLAS thread only spins
            self.center_ = float32_centre(counts @ means / counts.sum())
            self.center_products_ = self.centroids_ @ self.center_

    def _scores(self, x: FeatureSet, readout) -> np.ndarray:
        """readout(comp, z mu_c products, 1 / ||z||) per block of rows (:meth:`Compute.by_rows`),
        concatenated as float64: the cosines are the products times 1 / ||z|| (the rows of z are
        not normalised first). The products are (z - m) mu_c + m mu_c, m the ID-train mean rounded
        to float32: z - m is rounded relative to itself, m mu_c is one float64 value per class, so
        the product's float32 error is that of z - m, not of an offset shared by all features
        (LayerNorm-like features)."""
        comp = self._compute()
        cent, offsets = comp.put(self.centroids_).T, comp.put(self.center_products_)
        center = comp.put(self.center_)

        def block(zb):
            p = comp.centred(zb, center) @ cent
            p += offsets
            return readout(comp, p, comp.inverse_norm(zb))

        return comp.map_rows(block, x.features, width=max(x.features.shape[1], cent.shape[1]))


@register("cosine", tags=("paper21", "feature"), order=15)
class Cosine(_CentroidBase):
    """s = max_c cos(z, mu_c), mu_c the mean ID-train feature of class c (true labels).

    The class-centroid counterpart of a CLIP zero-shot max-similarity score (Fi-ImageNet-1k
    paper Sec. 2.1, following NINCO, Bitterwolf et al. 2023). Centroids are means of the raw
    features. No hyperparameters.
    """

    label = "cosine"

    def _score(self, x: FeatureSet) -> np.ndarray:
        return self._scores(x, lambda comp, p, inv: comp.rowmax(p) * inv)


@register("mcm", tags=("paper21", "feature"), order=16)
class MCM(_CentroidBase):
    """s = max_c softmax_c(cos(z, mu_c) / tau), the class-centroid form of MCM.

    Ming et al., "Delving into OOD detection with vision-language representations" (MCM),
    NeurIPS 2022, applied to ID-train class-mean features instead of text embeddings
    (Fi-ImageNet-1k paper Sec. 2.1). Default ``tau`` = 1 (docs/detectors.md); the zero-shot MCM names
    its temperature ``tau`` too (default 0.01 there, on text embeddings).
    """

    label = "MCM"

    constraints = {"tau": POSITIVE, **COMPUTE}

    def __init__(self, tau: float = 1.0, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.tau = tau
        self.compute_dtype = compute_dtype
        self.device = device

    def _score(self, x: FeatureSet) -> np.ndarray:
        # max softmax of cos / T (Compute.max_softmax): exp in the product dtype, sum in float64

        def readout(comp, p, inv):
            p *= comp.put(inv / self.tau)[:, None]  # in place on the product: cos_c / T
            return comp.max_softmax(p, overwrite=True)

        return self._scores(x, readout)


@register("fdbd", tags=("paper21", "feature"), order=17)
class FDBD(Detector):
    """fDBD: mean feature distance to the decision boundaries, regularised by the feature norm.

    Liu & Qin, "Fast decision boundary based OOD detector", ICML 2024:
    s = 1/(C-1) sum_{c != y} |f_y - f_c| / ||w_y - w_c||  /  ||z - zbar||,
    f = W z + b, y = argmax f, zbar the mean ID-train feature (the release's default
    regulariser). No hyperparameters.
    """

    label = "fDBD"

    needs = ("features", "head")
    fit_needs = ("features", "head")

    constraints = COMPUTE

    def __init__(self, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.compute_dtype = compute_dtype
        self.device = device

    def _fit(self, train: FeatureSet) -> None:
        self.train_mean_ = mean_rows(train.features, comp=self._compute())
        w = as64(train.weight)
        sq = np.einsum("cd,cd->c", w, w)
        with one_blas_thread():  # small: no idle BLAS threads under the scoring (docs/performance.md)
            gram = w @ w.T
        dist = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2.0 * gram, 0.0))
        np.fill_diagonal(dist, np.inf)
        if not (dist > 0).all():
            raise InputError("fdbd: two classes of the head have identical weight vectors")
        self.inv_boundary_norm_ = 1.0 / dist

    def _score(self, x: FeatureSet) -> np.ndarray:
        z = x.features
        c = x.weight.shape[0]
        if self.inv_boundary_norm_.shape != (c, c):
            raise InputError(f"fdbd was fitted with {len(self.inv_boundary_norm_)} classes, got {c}")
        comp = self._compute()
        w, b = comp.put(x.weight).T, comp.put(x.bias)
        inv = comp.put(self.inv_boundary_norm_)
        mean, rest = (comp.put(a) for a in centre_parts(self.train_mean_))
        inv_sum = comp.rowsum(inv)  # of the inverse norms as the products see them (1 / inf = 0 on the diagonal)

        # sum_c |f_y - f_c| / ||w_y - w_c|| = f_y sum_c inv_yc - sum_c f_c inv_yc, y = argmax f: both
        # sums in float64 of exact products of float32 values, so no float32 difference f_y - f_c;
        # ||z - zbar|| as ||(z - m32) - rest|| (centre_parts), summed in float64
        def block(zb):
            f = zb @ w
            f += b
            y = comp.argmax(f)
            dist = (comp.pick(f, y) * inv_sum[y] - comp.rowdot(f, inv[y])) / (c - 1)
            r = comp.centred(zb, mean)
            r -= rest
            return dist / comp.rownorm(r)

        return comp.map_rows(block, z, width=max(z.shape[1], c))


@register("neco", tags=("paper21", "feature"), order=18)
class NECO(Detector):
    """NECO: s = ||P_d x|| / ||x||, x the standardised feature, P_d the top-d PCA projection.

    Ben Ammar et al., "NECO: Neural collapse based OOD detection", ICLR 2024. Standardisation
    (per-dimension ID-train mean and std, as sklearn's StandardScaler; zero-variance dimensions
    keep scale 1) is applied to train and test alike; PCA = eigh of the covariance of the
    standardised train features. d: the smallest number of components explaining at least
    ``variance`` (default 0.9) of the variance, unless ``dim`` is given. ``maxlogit=True``
    multiplies by max_c f_c, which the release does for every non-ResNet backbone (ViT, DeiT,
    Swin); needs logits then. The class default is off (the paper's formula);
    :meth:`backbone_defaults` turns it on for non-ResNet backbones.
    The scatter is in the product precision (float32 products, float64 sums): the principal
    space reads the largest eigenvalues, which it resolves. The release's denominator for DeiT/Swin uses the raw feature norm; we keep the standardised
    norm for every backbone (the paper's formula).
    """

    label = "NECO"

    needs = ("features",)
    fit_needs = ("features",)

    constraints = {"variance": Interval(Real, 0, 1, closed="right"), "dim": (Interval(Integral, 1, None), None), "maxlogit": BOOLEAN, **COMPUTE}
    @classmethod
    def backbone_defaults(cls, backbone: BackboneInfo) -> dict[str, Default]:
        """``maxlogit``: True for every non-ResNet model (NECO release, ``neco()``: ``if
        model_architecture_type != 'resnet': score *= maxlogit``); needs logits, so it stays off
        for features without them (a VLM without a probe head)."""
        source = "NECO release: max-logit factor for every non-ResNet model"
        if backbone.family == "resnet":
            return {"maxlogit": Default(False, source + " (ResNet: off)")}
        if not backbone.has_logits:
            return {"maxlogit": Default(False, source + "; these features have no logits, so off")}
        return {"maxlogit": Default(True, source)}

    def __init__(
        self,
        variance: float = 0.9,
        dim: int | None = None,
        maxlogit: bool = False,
        compute_dtype: str = "float32",
        device: str | None = None,
    ) -> None:
        self.variance = variance
        self.dim = dim
        self.maxlogit = maxlogit
        self.compute_dtype = compute_dtype
        self.device = device

    def _fit(self, train: FeatureSet) -> None:
        z = train.features
        comp = self._compute()
        self.mean_ = mean_rows(z, comp=comp)
        s, n = scatter(z, self.mean_, comp=comp)
        var = np.diag(s) / n
        self.scale_ = np.where(var > 0, np.sqrt(var), 1.0)
        corr = s / n / np.outer(self.scale_, self.scale_)
        evals, evecs = eigh_one_thread(corr)
        order = np.argsort(evals)[::-1]
        evals, evecs = np.maximum(evals[order], 0.0), evecs[:, order]
        self.explained_variance_ratio_ = evals / evals.sum()
        if self.dim is not None:
            if not 1 <= int(self.dim) <= z.shape[1]:
                raise InputError(f"detector 'neco': dim={self.dim} must be an integer in [1, {z.shape[1]}] for {z.shape[1]}-d features")
            d = int(self.dim)
        else:
            cum = np.cumsum(self.explained_variance_ratio_)
            d = int(min(np.searchsorted(cum, self.variance - 1e-12) + 1, z.shape[1]))
        self.n_components_ = d
        self.components_ = evecs[:, :d]

    def _score(self, x: FeatureSet) -> np.ndarray:
        if self.maxlogit:
            x.require(("logits",), "neco(maxlogit=True)")
        z = x.features
        comp = self._compute()
        (mean, rest), scale, comps = (comp.put(a) for a in centre_parts(self.mean_)), comp.put(self.scale_), comp.put(self.components_)

        def block(zb):  # standardised as ((z - m32) - rest) / scale (centre_parts), then projected
            s = comp.centred(zb, mean)
            s -= rest
            s /= scale
            return comp.rownorm(s @ comps) / comp.rownorm(s)

        ratio = comp.map_rows(block, z, width=z.shape[1])
        return ratio * np.asarray(x.logits).max(axis=1) if self.maxlogit else ratio


_SHE_METRICS = ("inner_product", "euclidean", "cosine")


@register("she", tags=("feature",))
class SHE(OptInDetector):
    """Simplified Hopfield energy: s = <z, S_y>, y = argmax f, S_k the mean ID-train feature of
    the rows labelled k and predicted k (Zhang et al., "OOD detection based on in-distribution
    data patterns memorization with modern Hopfield energy", ICLR 2023).

    ``metric`` "inner_product" (default: OpenOOD's ``she.yml``, pytorch-ood 0.4's only one), or OpenOOD's alternatives "euclidean"
    (-||z - S_y||) and "cosine". A class without a correctly classified ID-train row takes the
    mean of its labelled rows as its pattern (OpenOOD's mean is then NaN, pytorch-ood refuses).
    ``compute_dtype="float32"`` (default): the class sums are float32 sparse products added in
    float64 (as every class mean here), in one pass over ID train; <z, S_y> is taken about m32
    (the patterns' mean m rounded to float32) as <z - m32, S32_y> + <m32, S32_y> + <m, S_y - S32_y>
    (S32 the pattern rounded to float32): the first a row dot of float32 values summed in float32
    runs added in float64 (:meth:`~oodeval.detectors._backend.Compute.rundot`, off by about
    64 u sum_j |z_j - m32_j| |S_j|, u = 2^-24, so an offset the features share does not grow the
    error), the other two per class in float64; z - S_y is formed as (z - S32_y) - (S_y - S32_y).
    "float64": everything in float64. ``device``: None = numpy, or a torch device.
    """

    needs = ("features", "logits")
    fit_needs = ("features", "logits", "labels")

    constraints = {"metric": Options(*_SHE_METRICS), **COMPUTE}

    def __init__(self, metric: str = "inner_product", compute_dtype: str = "float32", device: str | None = None) -> None:
        self.metric = metric
        self.compute_dtype = compute_dtype
        self.device = device

    def _fit(self, train: FeatureSet) -> None:
        comp = self._compute()
        y = np.asarray(train.labels)
        _, classes = labelled(y, "she")
        correct = comp.map_rows(comp.argmax, train.logits).astype(np.int64) == y
        # one pass: each class's correctly classified rows, or all its labelled rows where it has none
        rest = np.setdiff1d(classes, y[correct])
        rows_of = np.where(correct | np.isin(y, rest), y, -1)
        patterns = np.zeros((train.logits.shape[1], train.features.shape[1]))
        patterns[classes] = class_means(train.features, rows_of, classes, comp=comp)[0]
        self.patterns_ = patterns
        # the patterns in the product dtype, what that rounding drops, the centre m32 the scored rows
        # are taken about, and per class <m32, S32_y> + <m, S_y - S32_y>
        mean = patterns.mean(axis=0)
        self.rounded_ = np.asarray(patterns, dtype=comp.precision)
        self.dropped_ = patterns - self.rounded_
        self.centre_ = float32_centre(mean)
        with one_blas_thread():  # two products of a (C, D) matrix: a second BLAS thread only spins
            self.offsets_ = self.rounded_.astype(np.float64) @ self.centre_ + self.dropped_ @ mean

    def _score(self, x: FeatureSet) -> np.ndarray:
        comp = self._compute()
        patterns = comp.put(self.rounded_)
        if self.metric == "inner_product":
            offset, centre = comp.put(self.offsets_, "float64"), comp.put(self.centre_)

            def block(z, f):
                y = comp.argmax(f)
                return comp.rundot(comp.centred(z, centre), comp.take_rows(patterns, y)) + offset[y]
        else:
            lows = comp.put(self.dropped_)

            def block(z, f):
                y = comp.argmax(f)
                if self.metric == "euclidean":
                    diff = z - patterns[y]
                    diff -= lows[y]
                    return -comp.rownorm(diff)
                s = patterns[y]
                return comp.rowdot(z, s) * comp.inverse_norm(z) * comp.inverse_norm(s)

        return comp.map_rows(block, x.features, x.logits)


#: the kernel PCA release's explained-variance ratio per kernel (run_detection.sh, ImageNet ResNet-50,
#: standard training: CoP 0.99, CoRP 0.5)
KPCA_EXPLAINED = {"cosine": 0.99, "cosine_gaussian": 0.5}


@register("kpca", tags=("feature", "since-paper"))
class KernelPCA(OptInDetector):
    """Kernel PCA reconstruction error: s = -||phi(x) - m - U_q U_q' (phi(x) - m)|| (higher = ID).

    Fang, Tao, Lv, He, Huang & Yang, "Kernel PCA for out-of-distribution detection", NeurIPS 2024;
    the authors' release (fanghenshaometeor/ood-kernel-pca, ``CoP_CoRP_ImgNet.py`` at
    5f24c69412d82e4fb0d14bdf6eae6f922f38d53b). x = z / (||z|| + 1e-10) (the cosine kernel's map);
    ``kernel="cosine_gaussian"`` (CoRP, default) maps further by random Fourier features of a
    Gaussian kernel, phi(x) = sqrt(2/M) cos(x G' + u), G ~ sqrt(2 ``gamma``) N(0, 1) of shape
    (M, D), u ~ U[0, 2 pi), drawn with ``seed``; "cosine" (CoP): phi(x) = x. m = the ID-train mean
    of phi; U_q = the top q eigenvectors of the scatter of phi - m over ID train, q the least
    count whose eigenvalues explain ``explained_variance`` of the total (None: the release's
    ImageNet ResNet-50 setting per kernel, 0.5 for CoRP and 0.99 for CoP; ``run_detection.sh``).
    Defaults gamma = 3, M = ``n_features`` = 4096 (the same script). The squared residual is read
    as ||phi - m||^2 - ||U_q'(phi - m)||^2, clipped at 0, or, where q > M / 2, as ||V'(phi - m)||^2
    with V the other M - q eigenvectors (the same quantity without the cancellation, and the smaller
    product). float64 throughout: the fit's chunks of rows (map, centring, the symmetric product)
    run one per core on one BLAS thread each and are added in chunk order; the eigendecomposition
    runs on one BLAS thread; the score's row blocks run one per core.
    """

    label = "KPCA"

    needs = ("features",)
    fit_needs = ("features",)

    constraints = {"kernel": Options("cosine_gaussian", "cosine"), "explained_variance": (Interval(Real, 0, 1, closed="right"), None),
                   "gamma": POSITIVE, "n_features": Interval(Integral, 1, None), "seed": SEED}  # fmt: skip

    def __init__(self, kernel: str = "cosine_gaussian", explained_variance: float | None = None, gamma: float = 3.0,
                 n_features: int = 4096, seed: int = 0) -> None:  # fmt: skip
        self.kernel = kernel
        self.explained_variance = explained_variance
        self.gamma = gamma
        self.n_features = n_features
        self.seed = seed

    def _map(self, z: np.ndarray) -> np.ndarray:
        """phi of a block of rows, float64 (the RFF's (rows, M) product and cos written in place)."""
        x = as64(z)
        x = x / (np.linalg.norm(x, axis=1, keepdims=True) + 1e-10)
        if self.kernel == "cosine":
            return x
        phi = x @ self.rff_weights_.T
        phi += self.rff_phases_
        np.cos(phi, out=phi)
        phi *= np.sqrt(2.0 / self.n_features)
        return phi

    def _fit(self, train: FeatureSet) -> None:
        z = train.features
        if self.kernel == "cosine_gaussian":
            rng = np.random.default_rng(self.seed)
            self.rff_weights_ = np.sqrt(2.0 * self.gamma) * rng.standard_normal((int(self.n_features), z.shape[1]))
            self.rff_phases_ = 2.0 * np.pi * rng.random(int(self.n_features))
        width = z.shape[1] if self.kernel == "cosine" else int(self.n_features)
        comp = Compute("float64")
        # sums about a provisional centre c (the first chunk's mean), so that the scatter
        # sum (phi - c)(phi - c)' - N (m - c)(m - c)' cancels nothing of size |m|^2
        centre = self._map(z[next(comp.chunks(len(z), max(width, z.shape[1])))]).mean(axis=0)

        def part(sl: slice) -> np.ndarray:  # one chunk's [scatter; column sum] about c, on one core
            phi = self._map(z[sl])
            phi -= centre
            out = np.empty((width + 1, width))
            out[:width] = phi.T @ phi  # syrk: the symmetric product's half
            out[width] = phi.sum(axis=0)
            return out

        sums = comp.sum_chunks(part, len(z), max(width, z.shape[1]))
        shift = sums[width] / len(z)
        self.mean_ = centre + shift
        scatter_ = sums[:width] - len(z) * np.outer(shift, shift)
        del sums
        ratio = KPCA_EXPLAINED[self.kernel] if self.explained_variance is None else float(self.explained_variance)
        self.n_components_, self.components_, self.complement_ = kpca_spaces(scatter_, ratio)
        self.resolved_ = {"explained_variance": ratio}

    def _score(self, x: FeatureSet) -> np.ndarray:
        def block(z: np.ndarray) -> np.ndarray:  # squared residuals of a block of rows, on one core
            r = self._map(z)
            r -= self.mean_
            if self.complement_ is not None:  # the residual space is the smaller: project on it
                p = r @ self.complement_
                return np.einsum("ij,ij->i", p, p)
            p = r @ self.components_
            return np.maximum(np.einsum("ij,ij->i", r, r) - np.einsum("ij,ij->i", p, p), 0.0)

        return -np.sqrt(Compute("float64").by_rows(block, x.features))


def kpca_spaces(scatter_: np.ndarray, ratio: float) -> tuple[int, np.ndarray, np.ndarray | None]:
    """(q, U_q, complement or None) of a symmetric PSD scatter: q the least count of its largest
    eigenvalues (clipped at 0) explaining ``ratio`` of their sum, U_q their eigenvectors (width, q),
    and, where q exceeds width / 2, the other width - q eigenvectors (the residual space, read
    directly: ||r||^2 - ||U_q'r||^2 would cancel most of ||r||^2, and the complement's product is
    the smaller). LAPACK on one BLAS thread (:func:`eigh_one_thread`'s reason)."""
    evals, evecs = eigh_one_thread(scatter_)
    evals, evecs = np.maximum(evals[::-1], 0.0), evecs[:, ::-1]
    width = len(evals)
    q = int(min(np.searchsorted(np.cumsum(evals) / evals.sum(), ratio, side="left") + 1, width))
    return q, np.ascontiguousarray(evecs[:, :q]), (np.ascontiguousarray(evecs[:, q:]) if 2 * q > width else None)


#: rows per sub-block of ORA's per-class cosine: its (rows, C) terms (4 of them, 1 MB of float32 at
#: C = 1000) stay in a core's cache
ORA_SUB_ROWS = 64


@register("ora", tags=("feature", "since-paper"))
class ORA(OptInDetector):
    """ORA: s = max_{c != y} angle(x - mu, x_c - mu) / pi, x_c x's projection on the y|c boundary.

    Demirel, Fumero & Locatello, "Out-of-distribution detection with relative angles", NeurIPS
    2025 (arXiv 2410.04525); the authors' release (berkerdemirel/ORA-OOD-Detection-with-Relative-
    Angles, ``util/ood_methods.py::ora_score`` at 4a4b3d6). f = W z + b, y = argmax f; for each
    other class c, x_c = z - (f_y - f_c) / ||w_y - w_c||^2 (w_y - w_c) (z moved onto the decision
    boundary between y and c); mu = the mean of the class means (the release's ``torch.mean(
    class_means, 0)``; its ImageNet and CIFAR scripts take the class means of the labelled ID
    *test* split, here of ID train, as fDBD's mean is). The angle at mu, arccos of the cosine,
    is the largest where the cosine is the least, so the cosine is formed per class in closed
    form (u = z - mu, q_c = <u, w_y - w_c>, t_c = (f_y - f_c) / ||w_y - w_c||^2:
    cos = (|u|^2 - t_c q_c) / (|u| sqrt(|u|^2 - 2 t_c q_c + t_c^2 ||w_y - w_c||^2))) and one
    arccos taken per row. The release's own class (c = y) is 0/0, which it sets to 0; here it is
    left out (the max is over angles >= 0, so the same). No hyperparameters. ``compute_dtype`` /
    ``device``: the head's product W (z - m), m the mean rounded to float32 (so the difference is
    rounded relative to itself), and where it runs; the per-class cosine's terms are formed in the
    same dtype (float32 by default: rounded as the product is) in row blocks that stay in a core's
    cache, and |u|^2, the least cosine's division by |u| and the arccos in float64.
    """

    label = "ORA"

    needs = ("features", "head")
    fit_needs = ("features", "head", "labels")

    constraints = COMPUTE

    def __init__(self, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.compute_dtype = compute_dtype
        self.device = device

    def _fit(self, train: FeatureSet) -> None:
        _, classes = labelled(train.labels, "ora")
        means, _ = class_means(train.features, train.labels, classes, comp=self._compute())
        self.centre_ = means.mean(axis=0)
        w = as64(train.weight)
        sq = np.einsum("cd,cd->c", w, w)
        with one_blas_thread():  # small: no idle BLAS threads under the scoring
            gram = w @ w.T
        self.boundary_sq_ = np.maximum(sq[:, None] + sq[None, :] - 2.0 * gram, 0.0)
        off = ~np.eye(len(w), dtype=bool)
        if not (self.boundary_sq_[off] > 0).all():
            raise InputError("ora: two classes of the head have identical weight vectors")
        self.inv_boundary_sq_ = np.divide(1.0, self.boundary_sq_, out=np.zeros_like(self.boundary_sq_), where=off)  # 0 on the diagonal

    def _score(self, x: FeatureSet) -> np.ndarray:
        c = x.weight.shape[0]
        if self.boundary_sq_.shape != (c, c):
            raise InputError(f"ora was fitted with {len(self.boundary_sq_)} classes, got {c}")
        comp = self._compute()
        w64 = as64(x.weight)
        m32 = float32_centre(self.centre_)
        w, m = comp.put(x.weight).T, comp.put(m32)
        rest = self.centre_ - m32  # u = z - mu = (z - m32) - rest
        far = -(w64 @ rest)  # W u = W (z - m32) + far
        h = w64 @ self.centre_ + as64(x.bias)  # f = W u + h
        # the per-class terms in the product's dtype (float32 by default: rounded as the product is):
        # per (y, c), with the diagonal's own entries 0, s = 1 / ||w_y - w_c||^2 and s (h_y - h_c)
        dt = np.dtype(self.compute_dtype)
        inv_sq = self.inv_boundary_sq_
        terms = (far.astype(dt), h.astype(dt), inv_sq.astype(dt), np.multiply(inv_sq, np.subtract.outer(h, h), dtype=dt))
        rest_sq = float(rest @ rest)

        def block(zb: np.ndarray) -> np.ndarray:
            ub = comp.put(zb) - m
            g = comp.host(ub @ w)
            uu = comp.get(comp.rowdot(ub, ub)) - 2.0 * comp.get(ub @ comp.put(rest)) + rest_sq  # |u|^2, float64
            return self._block_scores(g, uu, *terms)

        if comp.device is None:
            return comp.by_rows(block, x.features)
        return np.concatenate([block(x.features[sl]) for sl in comp.chunks(len(x), max(x.features.shape[1], c))])

    @staticmethod
    def _block_scores(g: np.ndarray, uu: np.ndarray, far: np.ndarray, h: np.ndarray, inv_sq: np.ndarray, inv_sq_h: np.ndarray) -> np.ndarray:
        """The scores of a block of rows from g = W (z - m32) and |u|^2 (float64), the per-class
        terms in g's dtype, in sub-blocks of :data:`ORA_SUB_ROWS` rows that stay in a core's cache.
        With q_c = (W u)_y - (W u)_c, a_c = f_y - f_c = q_c + h_y - h_c, t_c = a_c / ||w_y - w_c||^2:
        <u, v_c> = |u|^2 - t_c q_c and |v_c|^2 = |u|^2 - 2 t_c q_c + t_c a_c = <u, v_c> + t_c (h_y - h_c);
        the least <u, v_c> / |v_c| over c != y, divided by |u| (float64), is the least cosine."""
        out = np.empty(len(g))
        for s in range(0, len(g), ORA_SUB_ROWS):
            q = g[s : s + ORA_SUB_ROWS]
            q += far  # W u
            f = q + h
            y = f.argmax(axis=1)
            i = np.arange(len(y))
            np.subtract(f[i, y][:, None], f, out=f)  # a_c
            np.subtract(q[i, y][:, None], q, out=q)  # q_c
            t = np.take(inv_sq, y, axis=0)
            t *= f  # t_c
            q *= t
            u = uu[s : s + ORA_SUB_ROWS]
            np.subtract(u.astype(q.dtype)[:, None], q, out=q)  # <u, v_c>
            v = np.take(inv_sq_h, y, axis=0)
            v *= f  # t_c (h_y - h_c)
            v += q  # |v_c|^2
            np.sqrt(np.maximum(v, 0.0, out=v), out=v)
            q /= v
            q[i, y] = np.inf
            out[s : s + ORA_SUB_ROWS] = np.arccos(np.clip(q.min(axis=1) / np.sqrt(u), -1.0, 1.0)) / np.pi
        return out
