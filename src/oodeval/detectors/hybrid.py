"""Hybrid detectors combining features with logits: ViM (NNGuide lives in neighbours.py).

The peers' hybrid methods follow (opt-in, ``OptInDetector``): Residual (ViM's residual alone), the
neural relation graph, NCI, and the closed-form last-layer gradients GradNorm and GradUncertainty;
then pNML, since the paper.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
from scipy.special import logsumexp

from ..errors import InputError
from ..features import FeatureSet
from ..params import COMPUTE, POSITIVE, SEED, Integral, Interval, Options, Real
from . import REGISTRY, register
from ._backend import Compute, _torch, one_blas_thread
from ._common import as64, centre_parts, chunks, eigh_one_thread, float32_centre, labelled, mean_rows, scatter, whitening
from .base import Detector, OptInDetector
from .mahalanobis import WHITENED_ROUNDING_LIMIT, _refuse_over_budget
from .neighbours import _bank_rows

__all__ = ["ViM", "vim_dim", "logit_origin", "Residual", "Relation", "NCI", "GradNorm", "GradUncertainty", "PNML", "CADRef", "WeiPer"]

#: largest cond(G) = cond(W)^2 for which :func:`logit_origin` solves through the Gram matrix G:
#: the first solve is off by at most cond(G) eps (1e-4 here) and each refinement step multiplies
#: that error by cond(G) eps again, down to cond(W) eps; a worse-conditioned head goes through gelsy
GRAM_CONDITION_LIMIT = 1e12
#: refinement steps of :func:`logit_origin`
REFINE_STEPS = 2


@one_blas_thread()
def logit_origin(w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """u = -pinv(W) b for a (C, D) head: the minimum-norm least-squares solution of W u = -b.

    Through the Cholesky factor of the smaller Gram matrix G: u = W^T y with G y = -b, G = W W^T
    (C <= D), or G u = -W^T b with G = W^T W (C > D), each followed by :data:`REFINE_STEPS`
    steps of refinement on the residual r = -b - W u of the original system (u += W^T G^-1 r,
    or u += G^-1 W^T r: the corrected semi-normal equations, Bjorck 1987). For a 1000 x 1024 head
    that is one product and a 1000^3 / 3 factorisation, 0.04 s, against 0.1-0.2 s for LAPACK's
    complete orthogonal factorisation (gelsy). Where G is singular or LAPACK's estimate of
    cond(G) exceeds :data:`GRAM_CONDITION_LIMIT`, gelsy solves it, with numpy's pseudo-inverse
    cutoff (singular values under max(C, D) eps of the largest count as zero; gelsy's default
    cutoff, eps, kept a numerically zero one and returned |u| ~ 1e15). It runs on one BLAS
    thread: its products (numpy's BLAS) and factorisations (scipy's) alternate, and on two
    threads each met the other's idle threads spinning, 0.03-0.17 s a call, against 0.03 s.
    """
    w, b = as64(w), as64(b)
    wide = w.shape[0] <= w.shape[1]
    gram = w @ w.T if wide else w.T @ w
    factor, info = scipy.linalg.lapack.dpotrf(gram)
    if info == 0:
        rcond, info = scipy.linalg.lapack.dpocon(factor, np.abs(gram).sum(axis=0).max())
    if info != 0 or not rcond * GRAM_CONDITION_LIMIT >= 1:
        return -scipy.linalg.lstsq(w, b, cond=max(w.shape) * np.finfo(np.float64).eps, lapack_driver="gelsy")[0]

    def step(r: np.ndarray) -> np.ndarray:  # the least-norm / least-squares correction for residual r
        solve = lambda v: scipy.linalg.cho_solve((factor, False), v)  # noqa: E731
        return w.T @ solve(r) if wide else solve(w.T @ r)

    u = step(-b)
    for _ in range(REFINE_STEPS):
        u += step(-b - w @ u)
    return u


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
    ``compute_dtype`` ("float32" products with float64 sums, default, or "float64") and ``device``
    (None = numpy, or a torch device): see ``_backend``. The fit (scatter about u, eigh) is
    float64: the residual space is the covariance's smallest eigenvalues, which a float32 scatter
    cannot resolve. float32 guarantees: the residual is (z - m) R + (m - u) R, m the ID-train
    mean (rounded to float32, so z - m is rounded relative to itself) and (m - u) R a float64 vector, so its error is about
    sqrt(D) eps |z - m| (eps = 2^-24) whatever |u| (a near-singular head puts u far away) or the
    features' offset; the energy is as in the logit detectors, of an sgemm of the head.
    """

    label = "ViM"
    #: whether the fit scales the virtual logit to the logits (alpha; Residual reads it alone)
    scales_virtual_logit = True

    needs = ("features", "head")
    fit_needs = ("features", "head")

    constraints = {"dim": (Interval(Integral, 1, None), None), **COMPUTE}

    def __init__(self, dim: int | None = None, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.dim = dim
        self.compute_dtype = compute_dtype
        self.device = device

    def _fit(self, train: FeatureSet) -> None:
        z = train.features
        d = z.shape[1]
        k = vim_dim(d) if self.dim is None else int(self.dim)
        if not 0 < k < d:
            raise InputError(f"detector 'vim': dim={k} must be an integer in [1, {d - 1}] for {d}-d features")
        self.principal_dim_ = k
        self.origin_ = logit_origin(train.weight, train.bias)
        comp = self._compute()
        # float64: the residual space is the smallest eigenvalues', which a float32 scatter cannot resolve
        s, n, centred_sum = scatter(z, self.origin_, comp=Compute("float64", comp.device), with_sum=True)
        evals, evecs = eigh_one_thread(s / n)
        order = np.argsort(evals)[::-1]
        self.residual_basis_ = np.ascontiguousarray(evecs[:, order[k:]])
        # the mean from the scatter's pass: sum(z - u) / n + u, float64 (its error, eps64 |u|, is
        # far below the float32 rounding of the centre it becomes)
        self.train_mean_ = float32_centre(centred_sum / n + self.origin_)
        self.mean_residual_ = (self.train_mean_ - self.origin_) @ self.residual_basis_
        if self.scales_virtual_logit:
            max_logit, residual = self._parts(comp, train.features, train.weight, train.bias, energy=False)
            self.alpha_ = float(max_logit.sum() / residual.sum()) if residual.sum() > 0 else 0.0

    def residual_norm(self, z: np.ndarray) -> np.ndarray:
        """||(z - u) R|| in float64 for rows z (the virtual logit before scaling by alpha)."""
        return np.linalg.norm((as64(z) - self.origin_) @ self.residual_basis_, axis=1)

    def _parts(self, comp, z: np.ndarray, weight: np.ndarray, bias: np.ndarray, energy: bool):
        """(logsumexp f if ``energy`` else max f, ||(z - u) R||) per row as float64, f = W z + b:
        both products and their readouts block by block (:meth:`Compute.by_rows`). The residual
        is (z - m) R + (m - u) R, m the ID-train mean rounded to float32: z - m is rounded relative
        to itself and the far origin's part is one float64 vector, so its float32 error does not grow with
        |u| (a near-singular head puts u far from the features) or with the features' offset."""
        w, b = comp.put(weight).T, comp.put(bias)
        mean, basis = comp.put(self.train_mean_), comp.put(self.residual_basis_)
        shift = comp.put(self.mean_residual_, "float64")

        def block(c):
            part = comp.put(comp.centred(c, mean) @ basis, "float64")
            f = c @ w
            f += b
            logit = comp.logsumexp(f, overwrite=True) if energy else comp.rowmax(f)
            return logit, comp.rownorm(part + shift)

        return comp.map_rows(block, z, width=max(z.shape[1], w.shape[1]))

    def _score(self, x: FeatureSet) -> np.ndarray:
        comp = self._compute()
        energy, residual = self._parts(comp, x.features, x.weight, x.bias, energy=True)
        return energy - self.alpha_ * residual


@register("residual", tags=("feature",))
class Residual(OptInDetector, ViM):
    """Residual: s = -||(z - u) R||, ViM's virtual logit alone (Wang et al., CVPR 2022, Sec. 5).

    u = -pinv(W) b, R the eigenvectors of the uncentred covariance of (z - u) over ID train
    beyond the top ``dim`` (ViM's fit, :class:`~oodeval.detectors.hybrid.ViM`, less its alpha,
    which a residual alone does not read). ``dim`` defaults to ViM's rule (1000 if D >= 2048,
    512 if D >= 768, else D / 2), as the paper's Residual baseline shares ViM's D'; OpenOOD's
    ``residual.yml`` sets 512 for every network (which leaves a 512-d feature no residual) and
    fits on its ID ``val`` split, here the ID-train set. The fit is float64 (the residual space is
    the covariance's smallest eigenvalues); the scored residual is ViM's, (z - m) R + (m - u) R,
    in ``compute_dtype`` ("float32", default: its float32 error about sqrt(D) eps |z - m|
    whatever |u|, see ViM; "float64") on ``device`` (None = numpy, or a torch device).
    """

    scales_virtual_logit = False

    constraints = {"dim": (Interval(Integral, 1, None), None), **COMPUTE}

    def __init__(self, dim: int | None = None, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.dim = dim
        self.compute_dtype = compute_dtype
        self.device = device

    def _score(self, x: FeatureSet) -> np.ndarray:
        comp = self._compute()
        mean, basis = comp.put(self.train_mean_), comp.put(self.residual_basis_)
        shift = comp.put(self.mean_residual_, "float64")

        def block(c):
            return comp.rownorm(comp.put(comp.centred(c, mean) @ basis, "float64") + shift)

        return -comp.map_rows(block, x.features, width=x.features.shape[1])


#: bank rows per block of relation's products (numpy, torch): a (512, 8192) float32 block per core
RELATION_BLOCK = {False: 8192, True: 65536}


@register("relation", tags=("hybrid",))
class Relation(OptInDetector):
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
    Scoring N rows costs 2 N B (D + C) flop (B bank rows): about 4e13 per 50k rows against a
    200k-row bank at D = 1024, C = 1000 (some 5 min of 2 cores). A call beyond ``budget_tflop``
    (default 100, as the Gaussian mixtures') is refused before any work: score fewer rows at a
    time, lower ``bank_fraction``, or raise the budget (on a GPU ``device`` the same work takes well under a minute).
    """

    needs = ("features", "logits")
    fit_needs = ("features", "logits")

    constraints = {"pow": POSITIVE, "thres": Interval(Real, None, None), "bank_fraction": Interval(Real, 0, 1, closed="right"), "seed": SEED,
                   "budget_tflop": POSITIVE, **COMPUTE}  # fmt: skip

    def __init__(self, pow: float = 1.0, thres: float = 0.03, bank_fraction: float = 1.0, seed: int = 0, compute_dtype: str = "float32", device: str | None = None,
                 budget_tflop: float = 100.0) -> None:  # fmt: skip
        self.budget_tflop = budget_tflop
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
        bank, width = self.bank_features_.shape[0], self.bank_features_.shape[1] + self.bank_probs_.shape[1]
        _refuse_over_budget("relation", 2.0 * len(x) * bank * width, self.budget_tflop, f"scoring {len(x)} rows against a bank of {bank}",
                            "score fewer rows at a time, lower bank_fraction")  # fmt: skip
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
class NCI(OptInDetector):
    """Neural-collapse inspired: s = <w_y, z - mu> / ||z - mu|| + alpha ||z||_1, y = argmax f.

    Liu & Qin, "Detecting out-of-distribution through the lens of neural collapse", CVPR 2025.
    mu = the mean ID-train feature, w_y the head's row of the predicted class. ``alpha`` =
    1e-4 is OpenOOD's default (``nci.yml``; pytorch-ood's is 0, which drops the norm term).
    ``compute_dtype="float32"`` (default): z - mu is formed as (z - m32) - rest (m32 = mu rounded
    to float32, rest = mu - m32; :func:`~oodeval.detectors._common.centre_parts`), so it is
    rounded relative to itself, not to an offset the features share; the row dots, ||z - mu||^2
    and ||z||_1 are float32 sums over runs of 64 entries added in float64
    (:meth:`~oodeval.detectors._backend.Compute.rundot`: each off by about 64 u of the sum of its
    terms' magnitudes, u = 2^-24), so the cosine term is off by about 64 u |w_y| and the norm
    term by 64 u of itself. "float64": everything in float64. ``device``: None = numpy, or a
    torch device.
    """

    needs = ("features", "logits", "head")
    fit_needs = ("features",)

    constraints = {"alpha": Interval(Real, None, None), **COMPUTE}

    def __init__(self, alpha: float = 1e-4, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.alpha = alpha
        self.compute_dtype = compute_dtype
        self.device = device

    def _fit(self, train: FeatureSet) -> None:
        self.train_mean_ = mean_rows(train.features, comp=self._compute())

    def _score(self, x: FeatureSet) -> np.ndarray:
        comp = self._compute()
        m32, rest = centre_parts(self.train_mean_)
        w, m32, rest = comp.put(x.weight), comp.put(m32), comp.put(rest)
        alpha = float(self.alpha)

        def block(z, f):
            c = comp.centred(z, m32)
            c -= rest
            cosine = comp.rundot(comp.take_rows(w, comp.argmax(f)), c) / comp.rundot(c, c) ** 0.5
            # ||z||_1 from |z| written over z - mu (no longer needed)
            return cosine if alpha == 0 else cosine + alpha * comp.runsum(comp.absolute(z, out=c))

        return comp.map_rows(block, x.features, x.logits)


def _softmax64(f: np.ndarray, t: float = 1.0) -> np.ndarray:
    f = as64(f) / t
    e = np.exp(f - f.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


@register("gradnorm", tags=("hybrid",))
class GradNorm(OptInDetector):
    """GradNorm: s = || dL/dW ||_1 = ||softmax(f / T) - 1/C||_1 ||z||_1 / T, W the head's weight.

    Huang, Geng & Li, "On the importance of gradients for detecting distributional shifts in
    the wild", NeurIPS 2021. L = (1/C) sum_c -log softmax(f / T)_c, the cross-entropy to the
    uniform distribution (KL(u || p) up to a constant); dL/df = (softmax(f / T) - 1/C) / T and
    dL/dW = (dL/df) z^T, whose entrywise l1 norm factors. The releases (the paper's, OpenOOD's)
    read only the last layer's weight, so this is exact on cached features; T = 1 as they do.
    Their loss sums over classes (targets all ones), C times this one: the same ranking.
    ``compute_dtype="float32"`` (default): the exponentials e and |e - S/C| = S |p - 1/C| in
    float32 (S = sum_c e_c, summed in float64; each term off by a float32 ulp of e + S/C, so the
    l1 norm by about 2 eps absolutely), both l1 sums float32 runs of 64 added in float64
    (:meth:`~oodeval.detectors._backend.Compute.runsum`: sums of magnitudes, off by at most
    64 u = 3.8e-6 of themselves); "float64": everything in float64. ``device``: None = numpy, or
    a torch device.
    """

    needs = ("features", "logits")

    constraints = {"temperature": POSITIVE, **COMPUTE}

    def __init__(self, temperature: float = 1.0, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.temperature = temperature
        self.compute_dtype = compute_dtype
        self.device = device

    def _score(self, x: FeatureSet) -> np.ndarray:
        comp = self._compute()
        t = float(self.temperature)

        def block(z, f):
            _, e, total = comp.shifted_exp(f if t == 1 else f / t, out=comp.scratch_like(f))
            e -= comp.put(total / e.shape[1])[:, None]  # e - total / C = total (p - 1/C), in place
            spread = comp.runsum(comp.absolute(e, out=e)) / total
            return spread * comp.runsum(comp.absolute(z, out=comp.scratch_like(z, "z"))) / t

        return comp.map_rows(block, x.features, x.logits)


@register("grad_uncertainty", tags=("hybrid",))
class GradUncertainty(OptInDetector):
    """Gradient uncertainty on the head: s = ||C p - 1||^2 (||z||^2 + 1), p = softmax(f).

    Oberdiek, Rottmann & Gottschalk, "Classification uncertainty of deep neural networks based on
    gradient information", ANNPR 2018 (pytorch-ood's ``GradUncertainty``): the squared l2 norms
    of the gradients of L = BCE(p, 1) = -sum_c log p_c with respect to the head's weight and
    bias (dL/df = C p - 1), summed. pytorch-ood sums over the parameters it is given; with only
    the linear head this is its score, except that torch's BCE backward divides by max(p (1 - p),
    1e-12), which bends its gradient on rows with a class of p (1 - p) < 1e-12 (confident ones).
    """

    needs = ("features", "logits")

    def _score(self, x: FeatureSet) -> np.ndarray:
        out = np.empty(len(x))
        for sl in chunks(len(x), max(x.features.shape[1], x.logits.shape[1])):
            p = _softmax64(x.logits[sl])
            g = np.square(p.shape[1] * p - 1).sum(1)
            out[sl] = g * (np.square(as64(x.features[sl])).sum(1) + 1)
        return out


@register("pnml", tags=("hybrid", "since-paper"))
class PNML(OptInDetector):
    """pNML regret: s = -R(x), R = log(sum_c p_c / (p_c + (1 - p_c) p_c^k)) / log C (higher = ID).

    Bibas, Feder & Hassner, "Single layer predictive normalized maximum likelihood for
    out-of-distribution detection", NeurIPS 2021, as pytorch-ood 0.4.0's ``PNML``
    (``pytorch_ood/detector/pnml.py``): x = z / ||z||, k = x' P x / (1 + x' P x) with P =
    pinv(X'X), X the l2-normalised labelled ID-train features; p = softmax(W x + b) (the head on
    the normalised feature), clamped to [``eps``, 1 - ``eps``] (default 1e-12, pytorch-ood's).
    The authors' repository (kobybibas/pnml_ood_detection) varies between versions (a bias column
    in X, the orthogonal part of x, the model's own probabilities); this follows pytorch-ood.
    Fit in float64 (X'X's small eigenvalues are what P reads), P = V V' (V from
    :func:`~oodeval.detectors._common.whitening`, numpy's pseudo-inverse cutoff), so x' P x =
    ||x V||^2; each term is computed as 1 / (1 + (1 - p_c) p_c^(k - 1)). ``compute_dtype``
    "float32" (default): the products x V and W x, log p and the terms in float32, every row sum
    in float64; where the float32 rounding of x read through sqrt(N) V exceeds the Mahalanobis
    family's limit (:data:`~oodeval.detectors.mahalanobis.WHITENED_ROUNDING_LIMIT`) the fit switches
    to float64 and records it in ``resolved_``. ``device``: None = numpy, or a torch device.
    """

    label = "pNML"

    needs = ("features", "head")
    fit_needs = ("features", "head", "labels")

    constraints = {"eps": Interval(Real, 0, 0.5, closed="neither"), **COMPUTE}

    def __init__(self, eps: float = 1e-12, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.eps = eps
        self.compute_dtype = compute_dtype
        self.device = device

    def _fit(self, train: FeatureSet) -> None:
        idx, classes = labelled(train.labels, "pnml")
        d = train.features.shape[1]
        stats = Compute("float64", self._compute().device)
        gram, _ = scatter(train.features, np.zeros((classes.size, d)), train.labels, classes, normalise=True, comp=stats)
        self.projection_ = whitening(gram)
        # |x| = 1, so each entry's float32 rounding is eps32 / 2 of 1 / sqrt(D) in rms; read through
        # sqrt(N) V (the whitening of E[x x'], in which an ID row's ||u||^2 is about the rank, as in
        # the Mahalanobis family's units)
        self.whitened_rounding_ = float(np.finfo(np.float32).eps / 2 / np.sqrt(d) * np.sqrt(idx.size) * np.linalg.norm(self.projection_))
        if self.compute_dtype == "float32" and self.whitened_rounding_ > WHITENED_ROUNDING_LIMIT:
            self.resolved_ = {"compute_dtype": "float64"}

    def _score(self, x: FeatureSet) -> np.ndarray:
        comp = self._compute()
        xp = _torch() if comp.device is not None else np
        proj, w, b = comp.put(self.projection_), comp.put(x.weight).T, comp.put(x.bias)
        lo, hi, log_c = float(np.log(self.eps)), float(np.log1p(-self.eps)), float(np.log(x.weight.shape[0]))

        def block(c):
            z = comp.normalise(c)
            u = z @ proj
            q = comp.rowdot(u, u)
            k1 = comp.put(q / (1.0 + q) - 1.0)  # k - 1, in (-1, 0]
            f = z @ w
            f += b
            log_p = xp.clip(f - comp.put(comp.logsumexp(f))[:, None], lo, hi)
            terms = 1.0 / (1.0 - xp.expm1(log_p) * xp.exp(k1[:, None] * log_p))
            return -comp.log(comp.rowsum(terms)) / log_c

        return comp.map_rows(block, x.features, width=max(x.features.shape[1], w.shape[1]))


REGISTRY.alias("PNML", "pnml", "pytorch-ood 0.4", tags=("pytorch-ood",))


def _cadref_confidence(comp, f, method: str) -> np.ndarray:
    """CADRef's logit-based confidence S(f) per row, float64, of a product block ``f`` (which it may
    overwrite): the release's ``get_logits_score`` options; gen is 1 / sum over the top max(10, C / 10)
    softmax terms of p^0.1 (1 - p)^0.1 (gamma = 0.1), float64."""
    if method == "energy":
        return comp.get(comp.logsumexp(f, overwrite=True))
    if method == "maxlogit":
        return comp.get(comp.rowmax(f))
    if method == "msp":
        return comp.get(comp.max_softmax(f, overwrite=True))
    p = _softmax64(comp.get(f))
    m = max(10, p.shape[1] // 10)
    top = p if m >= p.shape[1] else np.partition(p, p.shape[1] - m, axis=1)[:, -m:]
    return 1.0 / (top**0.1 * (1.0 - top) ** 0.1).sum(axis=1)


@register("cadref", tags=("hybrid", "since-paper"))
class CADRef(OptInDetector):
    """CADRef: s = -(E_p(x) / S(f) + E_n(x) / mean_train S), the errors split by the head's signs.

    Ling et al., "CADRef: Robust out-of-distribution detection via class-aware decoupled relative
    feature leveraging", CVPR 2025 (arXiv 2503.00325); the authors' release
    (LingAndZero/CADRef, ``ood_methods/CADRef.py`` and ``utils/get_stat.py`` at e299a58), which
    pytorch-ood's development branch (``detector/cadref.py``, a94fab9) follows. f = W z + b,
    y = argmax f, r = (z - mu_y) * sign(w_y), mu_y the mean ID-train feature of the rows the
    head *predicts* as y (not their labels, as the release); E_p = sum_i max(r_i, 0) / ||z||_1,
    E_n = sum_i max(-r_i, 0) / ||z||_1; S the ``logit_score`` (default "energy" = logsumexp f,
    the release's default; "maxlogit", "msp", "gen": its other options, gen as the release's
    1 / sum over the top max(10, C / 10) softmax terms of p^0.1 (1 - p)^0.1). The paper's Eqs. 7-8
    split on sign(w_i z_i); the release splits the relative feature as here (pytorch-ood explains
    why the paper's text agrees with the release). Where the release leaves a class never
    predicted on ID train with a NaN centroid, its centroid is the mean of all ID-train rows
    (pytorch-ood's choice; ``unpredicted_classes_`` counts them), and ||z||_1 is clamped at 1e-12
    (pytorch-ood's). ``compute_dtype`` / ``device``: the head's product W z and the relative
    feature r (float32 by default: the features exact there, the class means rounded once, or
    float64) and where they run, in row blocks that stay in a core's cache; every row sum (||z||_1,
    sum r, sum |r|, the softmax sums) and the fitted class means and mean confidence are float64,
    sum max(r, 0) taken as (sum |r| + sum r) / 2.
    """

    label = "CADRef"

    needs = ("features", "head")
    fit_needs = ("features", "head")

    constraints = {"logit_score": Options("energy", "maxlogit", "msp", "gen"), **COMPUTE}

    def __init__(self, logit_score: str = "energy", compute_dtype: str = "float32", device: str | None = None) -> None:
        self.logit_score = logit_score
        self.compute_dtype = compute_dtype
        self.device = device

    def _over_rows(self, comp, fn, a: np.ndarray, width: int):
        """fn(block) over the rows of the host array ``a``, each block a host array (fn puts it in
        ``comp``): with numpy :meth:`Compute.by_rows` (blocks in a core's cache, one thread per
        core), on a torch device chunk by chunk."""
        if comp.device is None:
            return comp.by_rows(fn, a)
        parts = [fn(a[sl]) for sl in comp.chunks(len(a), width)]
        return tuple(np.concatenate(p) for p in zip(*parts)) if isinstance(parts[0], tuple) else np.concatenate(parts)

    def _fit(self, train: FeatureSet) -> None:
        comp = self._compute()
        w, b = comp.put(train.weight).T, comp.put(train.bias)
        c, d = train.weight.shape

        def block(zb: np.ndarray):  # (predicted class, confidence) per row
            f = comp.put(zb) @ w
            f += b
            return comp.host(comp.argmax(f)).astype(np.int64), _cadref_confidence(comp, f, self.logit_score)

        y, conf = self._over_rows(comp, block, train.features, max(d, c))
        sums = comp.zeros((c, d))
        for sl in comp.chunks(len(train), d):  # the class sums: one sparse product per chunk, added in float64
            sums += comp.groupsum(comp.put(train.features[sl]), y[sl], c)
        sums = comp.get(sums)
        counts = np.bincount(y, minlength=c).astype(np.float64)
        empty = counts == 0
        self.unpredicted_classes_ = int(empty.sum())
        means = sums / np.maximum(counts, 1)[:, None]
        means[empty] = sums.sum(axis=0) / counts.sum()
        self.class_means_ = means
        self.mean_confidence_ = float(np.sum(conf)) / len(train)

    def _score(self, x: FeatureSet) -> np.ndarray:
        if self.class_means_.shape != x.weight.shape:
            raise InputError(f"cadref was fitted with a {self.class_means_.shape} head, got {x.weight.shape}")
        comp = self._compute()
        w, b = comp.put(x.weight).T, comp.put(x.bias)
        # the split's terms in the product dtype (float32 by default: the features are exact there, the
        # means rounded once), their sums in float64
        means, sign = comp.put(self.class_means_), comp.put(np.sign(x.weight))

        def block(zb: np.ndarray) -> np.ndarray:
            z = comp.put(zb)
            f = z @ w
            f += b
            y = comp.argmax(f)
            conf = _cadref_confidence(comp, f, self.logit_score)
            norm = np.maximum(comp.get(comp.rowsum(abs(z))), 1e-12)
            r = comp.subtract(z, means[y], out=None)
            r *= sign[y]  # the relative feature, split by the sign of the head's row
            total = comp.get(comp.rowsum(r))
            positive = (comp.get(comp.rowsum(abs(r))) + total) / 2.0  # sum max(r, 0), its terms exact in float64
            return -(positive / norm / conf + (positive - total) / norm / self.mean_confidence_)

        return self._over_rows(comp, block, x.features, max(x.weight.shape))


REGISTRY.alias("CADRef", "cadref", "pytorch-ood development branch (after 0.4)", tags=("pytorch-ood",))


#: WeiPer's KL floors added to the smoothed densities (the release's ``calculate_WeiPerKLDiv_score``
#: ``epsilon`` and ``epsilon_noise``): of the penultimate features and of the perturbed logits
WEIPER_EPS = (0.01, 0.025)
#: rows per block of WeiPer's products: a block meets one perturbed head (C x D) at a time, its
#: logits (1024 x 1000 floats: 4 MB) binned and read by the softmax while in cache
WEIPER_BLOCK_ROWS = 1024


def uniform_smooth(p: np.ndarray, size: int) -> np.ndarray:
    """The running mean of ``size`` bins along the last axis, edges replicated and the window's
    extra bin on the right for an even size (torch's ``Conv1d(padding="same",
    padding_mode="replicate")`` with uniform weights: (size - 1) // 2 bins on the left)."""
    left = (size - 1) // 2
    padded = np.pad(p, [(0, 0)] * (p.ndim - 1) + [(left, size - 1 - left)], mode="edge")
    c = np.cumsum(padded, axis=-1)
    c = np.concatenate([np.zeros(p.shape[:-1] + (1,)), c], axis=-1)
    return (c[..., size:] - c[..., :-size]) / size


def symmetric_kl(p: np.ndarray, q: np.ndarray, eps: float) -> np.ndarray:
    """KL(p' || q') + KL(q' || p') per row of q, p' = (p + eps) / sum, q' = (q + eps) / sum."""
    p = (p + eps) / (p + eps).sum()
    q = (q + eps) / (q + eps).sum(axis=1, keepdims=True)
    return ((p - q) * (np.log(p) - np.log(q))).sum(axis=1)


@register("weiper", tags=("hybrid", "since-paper"))
class WeiPer(OptInDetector):
    """WeiPer+KLD: s = -(KL_z + lambda_1 KL_w - lambda_2 mean_k MSP(W_k z + b)) (higher = ID).

    Granz, Heurich & Landgraf, "WeiPer: OOD detection using weight perturbations of class
    projections", NeurIPS 2024 (arXiv 2405.17164); the authors' release (mgranz/weiper, OpenOOD's
    ``postprocessors/weiper_kldiv/utils.py`` and ``weiper_kldiv_postprocessor.py`` at f3cdf25).
    W_k = W + delta ||w_c|| n_kc / ||n_kc|| row by row, n_kc ~ N(0, I) (``n_repeats`` r of them,
    drawn with ``seed``); each row's density is the histogram of its own values (its D features;
    its r C perturbed logits W_k z + b) in ``n_bins`` equal bins spanning the min to the max over
    every ID-train value (values outside dropped), divided by the value count; KL_z, KL_w the
    symmetric KL divergences between the mean ID-train density and the row's density smoothed by
    a running mean of ``smoothing`` (``smoothing_perturbed``) bins, each with 0.01 (0.025) added
    before normalising; MSP the max softmax of each perturbed head's logits. Defaults: the
    release's configuration, ``configs/postprocessors/weiper_kldiv.yml`` (r = 100, delta = 1.8,
    100 bins, lambda_1 = 2.5, lambda_2 = 0.1, smoothing 4 and 15: its README's CIFAR-10 ResNet-18
    row); the README's ImageNet-1k rows: ResNet-50 delta 2.4, lambda_2 0.25, smoothing 40 and 15;
    ViT-B/16 delta 2.0, 80 bins, lambda_2 0.1, smoothing 40 and 15.
    Two of the release's steps are taken as the paper states them: its per-row histogram of more
    than 1000 values averages the histograms of consecutive 1000-value chunks (``batch_histogram``'s
    ``batch_size``), which weights a short last chunk (48 of ResNet-50's 2048 features) as much as
    a full one, and its train density is the mean of per-batch means; here every value and every
    row counts once (the same when the counts divide evenly). The fit reads ID train twice (the
    range, then the densities), as the release does. ``compute_dtype`` / ``device``: the perturbed
    heads' products (float32 by default; the bins and softmax are read from them, in float64 sums).
    Memory: the r C x D perturbed heads (400 MB of float32 for r = 100, C = 1000, D = 1024).
    Cost: 2 r C D flop per row for each pass of the perturbed heads (the fit's two over ID train,
    the score's one), 82 TFLOP for the fit on 200k ImageNet rows at r = 100; a fit or score beyond
    ``budget_tflop`` (default 100, as the Gaussian mixtures' and Relation's) is refused before any
    work: lower ``n_repeats`` (the cost is linear in it), fit on fewer rows or score fewer at a
    time, or raise the budget.
    """

    label = "WeiPer"

    needs = ("features", "head")
    fit_needs = ("features", "head")

    constraints = {"n_repeats": Interval(Integral, 1, None), "perturbation_distance": POSITIVE, "n_bins": Interval(Integral, 2, None),
                   "lambda_1": Interval(Real, 0, None), "lambda_2": Interval(Real, 0, None),
                   "smoothing": Interval(Integral, 1, None), "smoothing_perturbed": Interval(Integral, 1, None), "seed": SEED,
                   "budget_tflop": POSITIVE, **COMPUTE}  # fmt: skip

    def __init__(self, n_repeats: int = 100, perturbation_distance: float = 1.8, n_bins: int = 100, lambda_1: float = 2.5,
                 lambda_2: float = 0.1, smoothing: int = 4, smoothing_perturbed: int = 15, seed: int = 0,
                 compute_dtype: str = "float32", device: str | None = None, budget_tflop: float = 100.0) -> None:  # fmt: skip
        self.budget_tflop = budget_tflop
        self.n_repeats = n_repeats
        self.perturbation_distance = perturbation_distance
        self.n_bins = n_bins
        self.lambda_1 = lambda_1
        self.lambda_2 = lambda_2
        self.smoothing = smoothing
        self.smoothing_perturbed = smoothing_perturbed
        self.seed = seed
        self.compute_dtype = compute_dtype
        self.device = device

    def _heads(self, x: FeatureSet):
        """Per block of rows (``sl``, its features in ``comp``) and per perturbed head k, f = W_k z + b
        as host numpy in the product dtype: a block of rows (:data:`WEIPER_BLOCK_ROWS`) meets one
        head (C x D, in cache) at a time."""
        comp = self._compute()
        c = x.weight.shape[0]
        heads, b = comp.put(self.perturbed_weight_), comp.put(x.bias)
        for start in range(0, len(x), WEIPER_BLOCK_ROWS):
            sl = slice(start, min(start + WEIPER_BLOCK_ROWS, len(x)))
            zb = comp.put(x.features[sl])
            for k in range(int(self.n_repeats)):
                f = zb @ heads[k * c : (k + 1) * c].T
                f += b
                yield sl, k, comp.host(f)

    def _densities(self, t: np.ndarray, lo: float, hi: float) -> np.ndarray:
        """Each row's count of its values in each of ``n_bins`` bins of [lo, hi + 1e-8), values
        outside in two more (first and last, dropped by the caller): t = (v - lo) n / (hi + 1e-8 -
        lo) + 1, clipped to [0, n + 1], truncated. ``t`` (the values, a scratch array) is overwritten."""
        n = int(self.n_bins)
        scale = n / (hi + 1e-8 - lo)
        t *= t.dtype.type(scale)
        t += t.dtype.type(1.0 - lo * scale)
        np.clip(t, 0, n + 1, out=t)
        idx = t.astype(np.int32)
        idx += ((n + 2) * np.arange(len(t), dtype=np.int32))[:, None]
        return np.bincount(idx.ravel(), minlength=(n + 2) * len(t)).reshape(len(t), n + 2)

    def _perturbed(self, x: FeatureSet, lo: float, hi: float, with_msp: bool):
        """(counts (N, n_bins + 2) of every row's r C perturbed logits, mean MSP of the heads or None)."""
        counts = np.zeros((len(x), int(self.n_bins) + 2))
        msp = np.zeros(len(x)) if with_msp else None
        for sl, _, f in self._heads(x):
            if with_msp:  # the max softmax of this head: its max's term is exp(0) = 1
                g = f - f.max(axis=1, keepdims=True)
                msp[sl] += 1.0 / np.exp(g, out=g).sum(axis=1, dtype=np.float64)
            counts[sl] += self._densities(f, lo, hi)
        return counts, None if msp is None else msp / int(self.n_repeats)

    def _check_budget(self, x: FeatureSet, passes: int, what: str) -> None:
        c, d = x.weight.shape
        _refuse_over_budget("weiper", 2.0 * passes * len(x) * int(self.n_repeats) * c * d, self.budget_tflop,
                            f"{what} ({len(x)} rows, {passes} pass{'es' if passes > 1 else ''} of {int(self.n_repeats)} perturbed {c} x {d} heads)",
                            "lower n_repeats (the cost is linear in it), use fewer rows")  # fmt: skip

    def _fit(self, train: FeatureSet) -> None:
        self._check_budget(train, 2, "the fit")
        w = as64(train.weight)
        c, d = w.shape
        rng = np.random.default_rng(self.seed)
        scale = float(self.perturbation_distance) * np.linalg.norm(w, axis=1, keepdims=True)
        heads = np.empty((int(self.n_repeats) * c, d), dtype=self._compute().dtype if self.device is None else np.float64)
        for k in range(int(self.n_repeats)):
            noise = rng.standard_normal((c, d))
            heads[k * c : (k + 1) * c] = w + scale * noise / np.maximum(np.linalg.norm(noise, axis=1, keepdims=True), 1e-12)
        self.perturbed_weight_ = heads
        z_lo, z_hi = float(np.min(train.features)), float(np.max(train.features))
        f_lo, f_hi = np.inf, -np.inf
        for _, _, f in self._heads(train):
            f_lo, f_hi = min(f_lo, float(f.min())), max(f_hi, float(f.max()))
        self.ranges_ = ((z_lo, z_hi), (f_lo, f_hi))
        n = int(self.n_bins)
        dens_z = sum(self._densities(np.array(train.features[sl], dtype=np.float64), z_lo, z_hi)[:, 1 : n + 1].sum(axis=0) for sl in chunks(len(train), d))
        dens_f = self._perturbed(train, f_lo, f_hi, with_msp=False)[0][:, 1 : n + 1].sum(axis=0)
        self.train_densities_ = (dens_z / (d * len(train)), dens_f / (len(heads) * len(train)))

    def _score(self, x: FeatureSet) -> np.ndarray:
        c = x.weight.shape[0]
        if self.perturbed_weight_.shape != (int(self.n_repeats) * c, x.weight.shape[1]):
            raise InputError(f"weiper was fitted for a head of {len(self.perturbed_weight_) // int(self.n_repeats)} classes, got {c}")
        self._check_budget(x, 1, "scoring")
        (z_lo, z_hi), (f_lo, f_hi) = self.ranges_
        eps_z, eps_f = WEIPER_EPS
        n, d = int(self.n_bins), x.weight.shape[1]
        counts_f, msp = self._perturbed(x, f_lo, f_hi, with_msp=True)
        kl_f = symmetric_kl(self.train_densities_[1], uniform_smooth(counts_f[:, 1 : n + 1] / len(self.perturbed_weight_), int(self.smoothing_perturbed)), eps_f)
        kl_z = np.empty(len(x))
        for sl in chunks(len(x), d):
            dens = self._densities(np.array(x.features[sl], dtype=np.float64), z_lo, z_hi)[:, 1 : n + 1] / d
            kl_z[sl] = symmetric_kl(self.train_densities_[0], uniform_smooth(dens, int(self.smoothing)), eps_z)
        return -(kl_z + float(self.lambda_1) * kl_f - float(self.lambda_2) * msp)
