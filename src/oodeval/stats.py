"""Sampling statistics of OOD metrics (Fi-ImageNet-1k paper Sec. 4.6 and App. C).

- :func:`standard_error`: closed-form standard error of a rate (paper Eq. 5) with the
  finite-population correction (N - n) / (N - 1) when n of N are drawn without replacement.
- :func:`subsample`: draws of ``n`` OOD scores without replacement, the ID set (and hence the
  FPR@95 threshold) fixed, for many detectors at once on the *same* draws.
- :func:`rank_stability`: mean Spearman rho between the detector ranking on a draw and on the full set.
- :func:`bootstrap` / :func:`confidence_interval`: percentile bootstrap CIs, ID and OOD resampled.
- :func:`bootstrap_selective`: bootstrap draws of AURC / AUGRC, the ID samples resampled.
- :func:`mean_std`: mean +- std over runs, with the ddof returned beside the numbers.

Everything is vectorised over draws and detectors; randomness comes from an explicit seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import rankdata

from .errors import InputError
from .metrics import (
    _aurc_augrc_from_counts,
    _auroc_from_counts,
    _check_correct,
    _detection_error_from_counts,
    _fpr_from_counts,
    _fpr_ood_positive_from_counts,
    _k_for_tpr,
    check_scores,
    grouped_counts,
)

__all__ = [
    "standard_error",
    "subsample",
    "SubsampleResult",
    "rank_stability",
    "bootstrap",
    "bootstrap_selective",
    "confidence_interval",
    "mean_std",
]


def standard_error(p: float | np.ndarray, n: int, population: int | None = None) -> float | np.ndarray:
    """sqrt(p (1 - p) / n), times sqrt((N - n) / (N - 1)) when n of N are drawn without replacement."""
    if n <= 0:
        raise InputError(f"n must be positive, got {n}")
    p = np.asarray(p, dtype=np.float64)
    if ((p < 0) | (p > 1)).any():
        raise InputError("p must lie in [0, 1]")
    var = p * (1.0 - p) / n
    if population is not None:
        if population < n:
            raise InputError(f"population {population} is smaller than the draw size {n}")
        var = var * ((population - n) / (population - 1) if population > 1 else 0.0)
    out = np.sqrt(var)
    return float(out) if out.ndim == 0 else out


def _as_matrix(scores: object, name: str) -> np.ndarray:
    arr = np.asarray(scores, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[None, :]
    return check_scores(arr, name, ndim=2)


def _check_pair(id_scores: object, ood_scores: object) -> tuple[np.ndarray, np.ndarray]:
    x = _as_matrix(id_scores, "id_scores")
    y = _as_matrix(ood_scores, "ood_scores")
    if x.shape[0] != y.shape[0]:
        raise InputError(f"id_scores has {x.shape[0]} detectors but ood_scores has {y.shape[0]}")
    return x, y


@dataclass(frozen=True)
class SubsampleResult:
    """Per-draw metrics, arrays (detectors, draws); ``indices`` (draws, n) are the OOD samples of
    each draw; ``full_*`` are (detectors,) on all OOD scores."""

    fpr: np.ndarray
    auroc: np.ndarray
    indices: np.ndarray
    full_fpr: np.ndarray
    full_auroc: np.ndarray
    n: int
    population: int

    def closed_form_std(self) -> np.ndarray:
        """Eq. 5 with the finite-population correction, at the full-set FPR."""
        return standard_error(self.full_fpr, self.n, self.population)


def subsample(
    id_scores: object,
    ood_scores: object,
    n: int,
    draws: int = 1000,
    seed: int = 0,
    tpr: float = 0.95,
) -> SubsampleResult:
    """FPR@tpr and AUROC on ``draws`` random subsets of ``n`` OOD scores (without replacement).

    ``id_scores`` (K, n_id) and ``ood_scores`` (K, m) hold K detectors' scores of the same images
    (1-d arrays mean K = 1). The ID set is fixed, so the threshold is fixed; each OOD image then
    contributes a fixed amount to either metric and a draw's metric is the mean over its images,
    computed for all draws and detectors as one matrix product.
    """
    x, y = _check_pair(id_scores, ood_scores)
    m = y.shape[1]
    if not 0 < n <= m:
        raise InputError(f"draw size n={n} must lie in 1..{m} (the number of OOD scores)")
    if draws <= 0:
        raise InputError(f"draws must be positive, got {draws}")
    parts = [_fixed_id_parts(x[d], y[d], tpr) for d in range(x.shape[0])]
    accepted = np.stack([p[0] for p in parts])
    wins = np.stack([p[1] for p in parts])
    rng = np.random.default_rng(seed)
    chosen = np.argpartition(rng.random((draws, m)), n - 1, axis=1)[:, :n]
    mask = np.zeros((draws, m))
    np.put_along_axis(mask, chosen, 1.0, axis=1)
    return SubsampleResult(
        fpr=accepted @ mask.T / n,
        auroc=wins @ mask.T / n,
        indices=np.sort(chosen, axis=1),
        full_fpr=accepted.mean(axis=1),
        full_auroc=wins.mean(axis=1),
        n=n,
        population=m,
    )


def rank_stability(per_draw: np.ndarray, full: np.ndarray) -> float:
    """Mean over draws of Spearman's rho between the detector ranking on a draw and on the full set.

    ``per_draw`` is (K detectors, B draws), ``full`` is (K,). Ties take average ranks; a draw on
    which all detectors tie has no ranking and is left out of the mean.
    """
    per_draw = np.asarray(per_draw, dtype=np.float64)
    full = np.asarray(full, dtype=np.float64)
    if per_draw.ndim != 2 or full.shape != (per_draw.shape[0],):
        raise InputError(f"per_draw must be (K, B) and full (K,), got {per_draw.shape} and {full.shape}")
    if per_draw.shape[0] < 2:
        raise InputError("a ranking needs at least two detectors")
    r_draw = rankdata(per_draw, axis=0)
    r_full = rankdata(full)
    a = r_draw - r_draw.mean(axis=0)
    b = (r_full - r_full.mean())[:, None]
    denom = np.sqrt((a * a).sum(axis=0) * (b * b).sum())
    rho = np.divide((a * b).sum(axis=0), denom, out=np.full(denom.shape, np.nan), where=denom > 0)
    if np.isnan(rho).all():
        raise InputError("every draw ties all detectors; no ranking to compare")
    return float(np.nanmean(rho))


def _collapsed_bins(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Grouped counts with runs of ID-only values merged: FPR@tpr, AUROC and detection error
    depend only on these bins, so resampling the bins resamples the metric exactly."""
    I, O = grouped_counts(x, y)
    bin_id = np.cumsum(np.r_[True, (O[1:] > 0) | (O[:-1] > 0)]) - 1
    nb = bin_id[-1] + 1
    return np.bincount(bin_id, weights=I, minlength=nb), np.bincount(bin_id, weights=O, minlength=nb)


def _fixed_id_parts(x: np.ndarray, y: np.ndarray, tpr: float):
    """Per-OOD-sample contributions with the ID set fixed (one detector).

    Returns (accepted (m,), wins (m,), order (m,), tpr_g (G,), j_g (G,)): whether each OOD score
    passes the fixed FPR@tpr threshold; its AUROC share (#ID above + half the ties) / n; the OOD
    indices sorted by descending score; and, for the thresholds that can minimise the detection
    error (the lowest one for each count of OOD scores accepted), the fixed ID TPR and that count.
    """
    n = x.size
    xs = np.sort(x)
    k = _k_for_tpr(n, tpr)
    threshold = xs[n - k]
    accepted = (y >= threshold).astype(np.float64)
    lo = np.searchsorted(xs, y, side="left")
    hi = np.searchsorted(xs, y, side="right")
    wins = ((n - hi) + 0.5 * (hi - lo)) / n
    order = np.argsort(-y, kind="stable")
    values = np.unique(np.concatenate([x, y]))[::-1]
    tpr_g = (n - np.searchsorted(xs, values, side="left")) / n
    j_g = y.size - np.searchsorted(np.sort(y), values, side="left")
    # tpr_g and j_g grow together; for each OOD count j only the largest TPR can be the minimum
    last = np.r_[j_g[1:] != j_g[:-1], True]
    return accepted, wins, order, tpr_g[last], j_g[last]


def bootstrap(
    id_scores: object,
    ood_scores: object,
    draws: int = 1000,
    seed: int = 0,
    tpr: float = 0.95,
    fixed_id: bool = True,
) -> dict[str, np.ndarray]:
    """Bootstrap draws of fpr95, fpr95_ood_positive, tnr95, auroc, detection_error and autc, arrays
    (K detectors, draws).

    ``fixed_id=True`` (default) resamples the OOD scores with replacement and keeps the ID set,
    hence the FPR@95 threshold, fixed, as the paper's sampling analysis does (App. C, Eq. 5: the
    OOD sample is the scarce one; 655 OOD against 48,365 ID). The same resampled OOD images are
    used for every detector, so differences between detectors are paired.

    ``fixed_id=False`` resamples both sets. It runs on the collapsed score bins
    (:func:`_collapsed_bins`) as one multinomial per set, which has exactly the distribution of
    resampling the individual scores; draws are then independent across detectors (marginal CIs).

    With ``fixed_id=True`` the result also holds ``ood_index`` (draws, m), the resampled OOD
    indices. Average precision is not bootstrapped: it depends on ties inside ID-only runs that neither
    representation keeps. AUTC depends on the score values (their mean and the min-max range), so
    it is computed from the resampled values themselves: with ``fixed_id`` from the same resampled
    OOD indices, else from index resamples of both sets drawn after the other metrics' draws.
    """
    x, y = _check_pair(id_scores, ood_scores)
    if draws <= 0:
        raise InputError(f"draws must be positive, got {draws}")
    rng = np.random.default_rng(seed)
    K, m = y.shape
    if fixed_id:
        idx = rng.integers(0, m, size=(draws, m))
        counts = np.bincount((idx + m * np.arange(draws)[:, None]).ravel(), minlength=draws * m)
        counts = counts.reshape(draws, m).astype(np.float64)
        fpr = np.empty((K, draws))
        auc = np.empty((K, draws))
        det = np.empty((K, draws))
        fpr_oodpos = np.empty((K, draws))
        k_ood = _k_for_tpr(m, tpr)
        for d in range(K):
            accepted, wins, order, tpr_g, j_g = _fixed_id_parts(x[d], y[d], tpr)
            fpr[d] = counts @ accepted / m
            auc[d] = counts @ wins / m
            cum = np.concatenate([np.zeros((draws, 1)), np.cumsum(counts[:, order], axis=1)], axis=1)
            err = 0.5 * (1.0 - tpr_g) + 0.5 * cum[:, j_g] / m
            det[d] = np.minimum(err.min(axis=1), 0.5)
            # OOD positive: t = the k-th lowest resampled OOD score, FPR = share of ID scores <= t
            ascending = order[::-1]
            rejected = np.searchsorted(np.sort(x[d]), y[d][ascending], side="right") / x.shape[1]
            fpr_oodpos[d] = rejected[np.argmax(np.cumsum(counts[:, ascending], axis=1) >= k_ood, axis=1)]
        drawn = counts > 0
        autc = np.stack([_autc_draws(x[d].mean(), x[d].min(), x[d].max(), counts @ y[d] / m,
                                     np.where(drawn, y[d], np.inf).min(axis=1), np.where(drawn, y[d], -np.inf).max(axis=1))
                         for d in range(K)])  # fmt: skip
        return {"fpr95": fpr, "fpr95_ood_positive": fpr_oodpos, "tnr95": 1.0 - fpr, "auroc": auc, "detection_error": det,
                "autc": autc, "ood_index": idx}  # fmt: skip
    bins = [_collapsed_bins(x[d], y[d]) for d in range(K)]
    width = max(b[0].size for b in bins)
    I = np.zeros((K, draws, width))
    O = np.zeros((K, draws, width))
    for counts, total, out in ((0, x.shape[1], I), (1, m, O)):
        # one multinomial over the non-empty bins only; empty ones would still cost a binomial each
        where = [np.flatnonzero(b[counts]) for b in bins]
        p = np.zeros((K, max(w.size for w in where)))
        for d, w in enumerate(where):
            p[d, : w.size] = bins[d][counts][w] / total
        drawn = rng.multinomial(total, p[:, None, :], size=(K, draws))
        for d, w in enumerate(where):
            out[d][:, w] = drawn[d, :, : w.size]
    fpr = _fpr_from_counts(I, O, tpr)
    return {
        "fpr95": fpr,
        "fpr95_ood_positive": _fpr_ood_positive_from_counts(I, O, tpr),
        "tnr95": 1.0 - fpr,
        "auroc": _auroc_from_counts(I, O),
        "detection_error": _detection_error_from_counts(I, O),
        "autc": np.stack([_autc_draws(*_resampled_summary(x[d], rng, draws), *_resampled_summary(y[d], rng, draws)) for d in range(K)]),
    }


#: bootstrap draws resampled per block of index arrays (bounds the (block, n) memory)
_BLOCK = 64


def _resampled_summary(v: np.ndarray, rng: np.random.Generator, draws: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean, min and max of ``draws`` resamples (with replacement) of ``v``, each (draws,)."""
    out = np.empty((3, draws))
    for start in range(0, draws, _BLOCK):
        r = v[rng.integers(0, v.size, size=(min(_BLOCK, draws - start), v.size))]
        out[:, start : start + r.shape[0]] = r.mean(axis=1), r.min(axis=1), r.max(axis=1)
    return out[0], out[1], out[2]


def _autc_draws(x_mean, x_min, x_max, y_mean, y_min, y_max) -> np.ndarray:
    """AUTC (:func:`oodeval.metrics.autc`) from the means and ranges of the two samples; NaN where
    every score of a draw is one value."""
    lo = np.minimum(x_min, y_min)
    hi = np.maximum(x_max, y_max)
    span = hi - lo
    num = (hi - x_mean) + (y_mean - lo)
    return np.divide(num, 2 * span, out=np.full(np.shape(span), np.nan), where=span > 0)


def bootstrap_selective(id_scores: object, id_correct: object, draws: int = 1000, seed: int = 0) -> dict[str, np.ndarray]:
    """Bootstrap draws (draws,) of AURC and AUGRC (:func:`oodeval.metrics.aurc`, :func:`~oodeval.metrics.augrc`):
    they depend on the ID samples only, so the ID samples (score and correctness together) are
    resampled with replacement; a resampled duplicate ties with its original, as ties do there.
    The samples are sorted by descending score once; each draw's counts are summed per distinct score."""
    x, c = _check_correct(id_scores, id_correct)
    if draws <= 0:
        raise InputError(f"draws must be positive, got {draws}")
    rng = np.random.default_rng(seed)
    n = x.size
    order = np.argsort(-x, kind="stable")
    xs = x[order]
    starts = np.flatnonzero(np.r_[True, xs[1:] != xs[:-1]])
    wrong = ~c[order]
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)
    out = np.empty((2, draws))
    for start in range(0, draws, _BLOCK):
        b = min(_BLOCK, draws - start)
        drawn = position[rng.integers(0, n, size=(b, n))] + n * np.arange(b)[:, None]
        weights = np.bincount(drawn.ravel(), minlength=b * n).reshape(b, n).astype(np.float64)
        total = np.add.reduceat(weights, starts, axis=1)
        err = np.add.reduceat(weights * wrong, starts, axis=1)
        out[0, start : start + b], out[1, start : start + b] = _aurc_augrc_from_counts(total, err)
    return {"aurc": out[0], "augrc": out[1]}


def confidence_interval(draws: np.ndarray, level: float = 0.95, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval ((1 - level) / 2, (1 + level) / 2) of bootstrap draws along ``axis``."""
    if not 0 < level < 1:
        raise InputError(f"level must lie in (0, 1), got {level}")
    lo, hi = np.quantile(np.asarray(draws, dtype=np.float64), [(1 - level) / 2, (1 + level) / 2], axis=axis)
    return lo, hi


def mean_std(values: object, ddof: int = 1, axis: int = 0) -> dict[str, object]:
    """Mean and standard deviation over runs; ``ddof=1`` (sample std, as over 3 seeds) by default.

    Returns ``{"mean", "std", "ddof", "n"}`` so every printed std carries its ddof.
    """
    arr = np.asarray(values, dtype=np.float64)
    n = arr.shape[axis] if arr.ndim else 1
    if n == 0:
        raise InputError("no runs to average")
    if n <= ddof:
        raise InputError(f"{n} run(s) cannot give a std with ddof={ddof}")
    return {"mean": arr.mean(axis=axis), "std": arr.std(axis=axis, ddof=ddof), "ddof": ddof, "n": n}
