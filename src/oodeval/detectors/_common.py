"""Shared numerics for the post-hoc detectors: chunked passes, class statistics, readouts.

Every statistic is accumulated in float64 over row chunks of the (possibly memory-mapped)
float32 matrices, so fitting on 1.28M x 2048 features needs O(D^2 + C D) extra memory, not a
float64 copy of the matrix. Nothing here registers a detector.
"""

from __future__ import annotations

import numpy as np

from .._arrays import chunk_rows, chunks, l2_normalise
from ..errors import InputError
from ._backend import Compute, one_blas_thread

__all__ = [
    "chunk_rows", "chunks", "as64", "l2_normalise", "energy", "logsumexp_rows",
    "class_means", "labelled_chunks", "scatter", "scatter_rounding", "mean_rows", "pinv_sym", "eigh_one_thread", "float32_centre", "centre_parts", "whitening", "chunked_percentile", "labelled",
]  # fmt: skip


def as64(a: np.ndarray) -> np.ndarray:
    """A float64 copy (or view) of a chunk."""
    return np.asarray(a, dtype=np.float64)


def _shifted_exp_sum(f: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row max m and sum_c exp(f_c - m) of float64 rows, with one temporary."""
    m = f.max(axis=1)
    e = f - m[:, None]
    np.exp(e, out=e)
    return m, e.sum(axis=1)


def logsumexp_rows(logits: np.ndarray) -> np.ndarray:
    """log sum_c exp(f_c) per row in float64 (max-shifted, never overflows)."""
    m, total = _shifted_exp_sum(as64(logits))
    return m + np.log(total)


def energy(logits: np.ndarray, t: float = 1.0) -> np.ndarray:
    """Negative free energy T logsumexp(f / T) per row (Liu et al. 2020), float64."""
    f = as64(logits)
    return logsumexp_rows(f) if t == 1 else t * logsumexp_rows(f / t)


def labelled(labels: np.ndarray, who: str) -> tuple[np.ndarray, np.ndarray]:
    """Indices of rows with a label >= 0 and the sorted distinct labels; error if none."""
    labels = np.asarray(labels)
    idx = np.flatnonzero(labels >= 0)
    if idx.size == 0:
        raise InputError(f"{who} needs class labels, but all {labels.size} labels are -1")
    return idx, np.unique(labels[idx])


#: least rows per class in a chunk of :func:`class_means` that is read where it lies
CLASS_RUN = 16


def _stat_compute(comp: Compute | None) -> Compute:
    return Compute("float64") if comp is None else comp


def class_means(
    features: np.ndarray,
    labels: np.ndarray,
    classes: np.ndarray,
    normalise: bool = False,
    comp: Compute | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-class means (K, D) float64 and counts (K,) over rows with label in ``classes``.

    Rows with label -1 are skipped; ``normalise`` l2-normalises each row first. Each chunk's class
    sums are one sparse product in ``comp``'s precision, added into float64 sums (as
    :func:`scatter` adds each chunk's sgemm). Where the product reads the rows where they lie
    (numpy, rows already in its dtype, not normalised: no chunk is copied) a chunk spans at
    least :data:`CLASS_RUN` rows per class, so that adding its (K, D) sums into float64 costs
    a fraction of reading it (each class's sum in a chunk then runs over CLASS_RUN rows on average).
    """
    comp = _stat_compute(comp)
    d = features.shape[1]
    sums = comp.zeros((classes.size, d))
    counts = np.zeros(classes.size)
    step = comp.rows(d)
    if comp.device is None and not normalise and np.dtype(features.dtype) == comp.dtype:
        step = max(step, CLASS_RUN * classes.size)
    for sl in (slice(s, min(len(features), s + step)) for s in range(0, len(features), step)):
        y = np.asarray(labels[sl])
        keep = y >= 0
        if not keep.any():
            continue
        everyone = keep.all()  # then the chunk is used as it is, not copied by a mask
        # unnormalised rows are summed where they lie (the sparse product reads only the kept
        # ones); normalised ones are copied out first, so that only the kept rows are normalised
        z = comp.put(features[sl] if everyone or not normalise else features[sl][keep])
        if normalise:
            z = comp.normalise(z)
        group = np.searchsorted(classes, y if everyone else y[keep])
        rows = None if everyone or normalise else np.flatnonzero(keep)
        sums += comp.groupsum(z, group, classes.size, rows=rows)
        counts += np.bincount(group, minlength=classes.size)
    if (counts == 0).any():
        raise InputError(f"{int((counts == 0).sum())} of {classes.size} classes have no training rows")
    return comp.get(sums) / counts[:, None], counts


def labelled_chunks(features: np.ndarray, labels: np.ndarray, comp: Compute):
    """(rows, labels) of each row chunk of :meth:`Compute.chunks` with a label >= 0: the chunk as
    it is where every row is labelled (not a masked copy), else its labelled rows; chunks
    without one are skipped."""
    for sl in comp.chunks(len(features), features.shape[1]):
        y = np.asarray(labels[sl])
        keep = y >= 0
        if keep.all():
            yield features[sl], y
        elif keep.any():
            yield features[sl][keep], y[keep]


def scatter(
    features: np.ndarray,
    center: np.ndarray,
    labels: np.ndarray | None = None,
    classes: np.ndarray | None = None,
    normalise: bool = False,
    comp: Compute | None = None,
    with_sum: bool = False,
) -> tuple[np.ndarray, int] | tuple[np.ndarray, int, np.ndarray]:
    """Sum of outer products (z - c)(z - c)^T, accumulated in float64, and the row count
    (``with_sum``: and sum_i (z_i - c), float64, from the same pass: ViM's mean needs no second).

    ``center`` is one vector (D,), or per-class means (K, D) indexed by ``labels`` (rows with
    label -1 skipped). Divide by the count for the maximum-likelihood covariance. Rows are
    normalised and centred before the product (no E[zz^T] - mu mu^T cancellation). The chunks'
    products run one per core, each on one BLAS thread, and are added in chunk order
    (:meth:`Compute.sum_chunks`: the sequential sum, bit for bit, whatever the thread count).
    With ``comp`` in float32 each chunk's product is an sgemm added to the float64 sum, whose rounding (eps
    times the largest entries) swamps every eigenvalue below ~1e-6 of the largest: pseudo-inverses
    and residual spaces, which read those, pass a float64 ``comp`` (or check the float32 one
    against :func:`scatter_rounding`).
    """
    comp = _stat_compute(comp)
    center = comp.put(center)

    def chunk(sl: slice) -> _Count:
        rows = features[sl]
        if labels is not None:
            y = np.asarray(labels[sl])
            keep = y >= 0
            everyone = keep.all()  # then the chunk is used as it is, not copied by a mask
            z = comp.put(rows if everyone else rows[keep])
            if normalise:
                z = comp.normalise(z)
            mine = center[np.searchsorted(classes, y if everyone else y[keep])]
            z = comp.subtract(z, mine, out=mine)  # into the gathered means: no third (rows, D) array
        else:
            z = comp.put(rows)
            if normalise:
                z = comp.normalise(z)
            z = z - center
        part = z.T @ z  # added into a float64 sum: a float32 product is widened first
        part = part if comp.precision == "float64" else comp.put(part, "float64")
        return _Count(part, z.shape[0], comp.colsum(z) if with_sum else None)

    total = comp.sum_chunks(chunk, len(features), features.shape[1])
    if with_sum:
        return comp.get(total.s), total.n, comp.get(total.sum)
    return comp.get(total.s), total.n


class _Count:
    """A scatter's partial sum, its row count and (or None) its column sum, added together
    (:meth:`Compute.sum_chunks`)."""

    __slots__ = ("s", "n", "sum")

    def __init__(self, s, n: int, total=None) -> None:
        self.s, self.n, self.sum = s, n, total

    def __iadd__(self, other: "_Count") -> "_Count":
        self.s += other.s
        self.n += other.n
        if self.sum is not None:
            self.sum += other.sum
        return self


def scatter_rounding(covariance: np.ndarray, means: np.ndarray, counts: np.ndarray, whitenings: list, chunk: int,
                     normalised: bool = False) -> float:  # fmt: skip
    """Expected size of what the float32 class scatter (:func:`scatter` with a float32 ``comp``:
    float32 rows, less their class means rounded to float32, one sgemm per ``chunk`` rows added
    into float64) adds to the covariance ``S`` (the scatter / n), read through each whitening W
    (W W^T = S^+): an upper estimate of ||W^T E W||_F, E the float32 covariance less the exact
    one, as the sum of three terms, each rounding taken as up to eps32 / 2 in no particular
    direction (independent between chunks and rows):

    - the sgemm's running sums: an entry's sum over ``chunk`` rows is rounded at each term (it
      grows to about chunk sqrt(S_ii S_jj)), so with the n / chunk chunks E_ij has a standard
      deviation of at most c sqrt(S_ii S_jj), c = eps32 / 2 chunk / sqrt(3 n), and
      ||W^T E W||_F ~ c A, A = sum_i S_ii ||W_i||^2;
    - each centred value's rounding (one subtraction; with ``normalised``, also the scaled row's
      rounding, eps32 / 2 of the uncentred value, whose mean square is R_ii = S_ii + the class
      means' mean square): eps32 / 2 (1 + 2 normalised) sqrt(2 A B / (3 n)), B = sum_i R_ii ||W_i||^2;
    - the class means' float32 rounding delta_c (|delta_ci| <= eps32 / 2 |mu_ci|), a shift of
      every row of class c, which adds sum_c n_c delta_c delta_c^T / n: at most
      sum_c n_c / n (sum_i |delta_ci| ||W_i||)^2.

    Returns the largest over the whitenings. The float32 scatters of the conditioned problems of
    tests/test_detectors_precision.py came out 60 (condition number 1e8) to 1000 times below it."""
    eps = np.finfo(np.float32).eps / 2
    n = counts.sum()
    weights = counts / n
    diag = np.diag(covariance)
    square = diag + (weights @ means**2 if normalised else 0.0)
    worst = 0.0
    for w in whitenings:
        widths = np.einsum("ik,ik->i", w, w)
        a, b = diag @ widths, square @ widths
        shift = weights @ (eps * np.abs(means) @ np.sqrt(widths)) ** 2
        worst = max(worst, eps * min(chunk, n) / np.sqrt(3 * n) * a + eps * (1 + 2 * normalised) * np.sqrt(2 * a * b / (3 * n)) + shift)
    return float(worst)


def mean_rows(features: np.ndarray, normalise: bool = False, comp: Compute | None = None) -> np.ndarray:
    """Mean row in float64, accumulated in chunks."""
    comp = _stat_compute(comp)
    d = features.shape[1]
    total = comp.zeros((d,))
    for sl in comp.chunks(len(features), d):
        z = comp.put(features[sl])
        total += comp.colsum(comp.normalise(z) if normalise else z)
    return comp.get(total) / len(features)


def pinv_sym(a: np.ndarray) -> np.ndarray:
    """Pseudo-inverse of a symmetric positive semi-definite matrix (eigh-based)."""
    return np.linalg.pinv(a, hermitian=True)


def float32_centre(m: np.ndarray) -> np.ndarray:
    """``m`` rounded to float32 (returned as float64): a centre that float32 rows subtract with an
    error relative to z - m (one correctly rounded subtraction of two float32 values), never to
    |m|; the identities built on it (m mu_c, (m - u) R) use this same value, so they stay exact."""
    return np.asarray(m, dtype=np.float32).astype(np.float64)


def centre_parts(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(m32, rest): m rounded to float32 and m - m32, so that z - m = (z - m32) - rest is two
    subtractions each rounded relative to its own result (for a centre that is not only a
    reference point, e.g. the mean a norm is taken about)."""
    m32 = float32_centre(m)
    return m32, np.asarray(m, dtype=np.float64) - m32


def eigh_one_thread(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.linalg.eigh`` of a symmetric float64 matrix on one BLAS thread: a D x D
    eigendecomposition is mostly memory-bound reductions to tridiagonal form, so a second BLAS
    thread saves little wall time and spins between them (1024 x 1024 on the shared 2-core
    machine: 0.25 s of CPU on one thread, 1.27 s on two; docs/performance.md)."""
    with one_blas_thread():
        return np.linalg.eigh(np.asarray(a, dtype=np.float64))


def whitening(a: np.ndarray) -> np.ndarray:
    """W (D, k) with W W^T = pinv_sym(a) for a symmetric PSD ``a``: V_k L_k^-1/2 over the k
    eigenvalues above numpy's pseudo-inverse cutoff (max(D) eps times the largest), float64.
    LAPACK runs on one BLAS thread (:func:`eigh_one_thread`)."""
    evals, evecs = eigh_one_thread(a)
    # the eigenvalues ascend, so those kept are the last ones: a column slice, not a gather
    # (a gather of columns from the row-major eigenvectors took 19 ms at D = 1024, the slice 3)
    first = int(np.searchsorted(evals, a.shape[0] * np.finfo(np.float64).eps * max(evals.max(), 0.0), side="right"))
    return evecs[:, first:] / np.sqrt(evals[first:])


def chunked_percentile(values: np.ndarray, q: float, bins: int = 1 << 16, sample_rows: int = 1024) -> float:
    """Exactly ``np.percentile(values.ravel(), q)`` (linear interpolation) in chunked passes.

    First, one pass bracketed by a sample: the values of ``sample_rows`` evenly spaced rows give
    a range [lo, hi] that holds the two order statistics the interpolation needs with
    overwhelming probability (6 binomial standard deviations either side); the pass counts the
    values below lo and keeps those in [lo, hi]. Whether the range holds them is known exactly
    from the counts; when it does not (or ``sample_rows`` = 0) the histogram method runs: pass 1
    finds min/max and a histogram, pass 2 keeps only the values in the bins that hold the two
    order statistics. Memory stays O(sample + bins + chunk). Bins are computed in the values'
    own float dtype (one monotone function in both passes, which is all exactness needs); the
    kept values are sorted and interpolated in float64. NaN/inf raise ValueError.
    """
    if not 0 <= q <= 100:
        raise InputError(f"percentile must be in [0, 100], got {q}")
    flat_n = values.size
    if flat_n == 0:
        raise InputError("cannot take a percentile of 0 values")
    width = values.shape[1] if values.ndim == 2 else 1
    rows = values.reshape(len(values), -1) if values.ndim >= 1 else values.reshape(1, 1)
    dtype = rows.dtype if rows.dtype in (np.float32, np.float64) else np.dtype(np.float64)
    rank = (flat_n - 1) * q / 100.0
    k0, k1 = int(np.floor(rank)), int(np.ceil(rank))
    found = _bracketed(rows, width, dtype, k0, k1, sample_rows) if sample_rows > 0 else None
    v0, v1 = found if found is not None else _histogram(rows, width, dtype, k0, k1, bins)
    return float(v0 + (v1 - v0) * (rank - k0))


def _bracketed(rows: np.ndarray, width: int, dtype, k0: int, k1: int, sample_rows: int) -> tuple[float, float] | None:
    """Order statistics k0 <= k1 from one pass over the values in a sampled range, or None."""
    step = max(1, len(rows) // sample_rows)
    sample = np.sort(np.asarray(rows[::step], dtype=dtype).ravel())
    m, n = sample.size, rows.size
    spread = 6.0 * np.sqrt(m * 0.25) + 1
    i0, i1 = int(np.floor(k0 / n * m - spread)), int(np.ceil(k1 / n * m + spread))
    lo = sample[i0] if i0 > 0 else -np.inf
    hi = sample[i1] if i1 < m - 1 else np.inf
    # the values equal to an end of the range are counted, not kept (ReLU features put a large share
    # of every value at 0, an end of a low percentile's range), so memory stays the values inside it
    below, at_lo, at_hi, kept = 0, 0, 0, []
    for sl in chunks(len(rows), width):
        c = np.asarray(rows[sl], dtype=dtype).ravel()
        if not np.isfinite(c.sum()) and not np.isfinite(c).all():  # NaN/inf propagate through the sum
            raise InputError("cannot take a percentile of non-finite values")
        below += int(np.count_nonzero(c < lo))
        at_lo += int(np.count_nonzero(c == lo))
        at_hi += int(np.count_nonzero(c == hi)) if hi != lo else 0
        kept.append(c[(c > lo) & (c < hi)])
    sel = np.sort(np.concatenate(kept).astype(np.float64))
    if not (below <= k0 and k1 - below < at_lo + sel.size + at_hi):
        return None

    def value(i: int) -> float:  # the i-th of the sorted values in [lo, hi]
        if i < at_lo:
            return float(lo)
        return float(sel[i - at_lo]) if i - at_lo < sel.size else float(hi)

    return value(k0 - below), value(k1 - below)


def _histogram(rows: np.ndarray, width: int, dtype, k0: int, k1: int, bins: int) -> tuple[float, float]:
    """Order statistics k0 <= k1 from a histogram pass and a pass over the values in their bins."""
    lo, hi = np.inf, -np.inf
    for sl in chunks(len(rows), width):
        c = np.asarray(rows[sl], dtype=dtype)
        lo, hi = min(lo, float(c.min())), max(hi, float(c.max()))
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise InputError("cannot take a percentile of non-finite values")
    if lo == hi:
        return lo, lo
    lo_t, scale = dtype.type(lo), dtype.type(bins / (hi - lo))

    def bin_of(c: np.ndarray) -> np.ndarray:
        idx = ((c - lo_t) * scale).astype(np.intp).ravel()
        return np.minimum(idx, bins - 1, out=idx)

    counts = np.zeros(bins, dtype=np.int64)
    for sl in chunks(len(rows), width):
        counts += np.bincount(bin_of(np.asarray(rows[sl], dtype=dtype)), minlength=bins)
    cum = np.cumsum(counts)
    b0, b1 = int(np.searchsorted(cum, k0 + 1)), int(np.searchsorted(cum, k1 + 1))
    before = int(cum[b0 - 1]) if b0 > 0 else 0
    kept = []
    for sl in chunks(len(rows), width):
        c = np.asarray(rows[sl], dtype=dtype).ravel()
        idx = bin_of(c)
        kept.append(c[(idx >= b0) & (idx <= b1)])
    sel = np.sort(np.concatenate(kept).astype(np.float64))
    return sel[k0 - before], sel[k1 - before]
