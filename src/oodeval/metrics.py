"""Exact OOD-detection metrics (the conventions of docs/conventions.md).

Every score is "higher = more in-distribution" and ID is the positive class unless a name says
otherwise. All metrics are computed in float64 from one grouped representation of the two
samples: the distinct score values in descending order with the number of ID and OOD scores at
each value. That makes ties exact everywhere (AUROC counts a tie one half, a threshold accepts
every score equal to it) and lets :mod:`oodeval.stats` evaluate thousands of resampled draws on
the same representation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from .errors import InputError

__all__ = [
    "check_scores",
    "grouped_counts",
    "fpr_at_tpr",
    "tnr_at_tpr",
    "fpr_ood_positive",
    "auroc",
    "aupr_in",
    "aupr_out",
    "aupr_in_trapezoid",
    "aupr_out_trapezoid",
    "autc",
    "aurc",
    "augrc",
    "selective_metrics",
    "full_spectrum_metrics",
    "FULL_SPECTRUM",
    "detection_error",
    "accuracy",
    "all_metrics",
    "METRIC_NAMES",
    "FPR95_CONVENTIONS",
    "fpr95_columns",
    "AUPR_CONVENTIONS",
    "aupr_columns",
]

#: ``fpr95`` is the papers' FPR@95 (ID positive); ``fpr95_ood_positive`` the OpenOOD / pytorch-ood one
#: (OOD positive), see docs/detectors.md "Two FPR@95 conventions"
METRIC_NAMES = ("fpr95", "fpr95_ood_positive", "tnr95", "auroc", "aupr_in", "aupr_out", "detection_error",
                "aupr_in_trapezoid", "aupr_out_trapezoid", "autc")

#: convention -> (metric column, short label, what it counts); ``paper``: the Fi-ImageNet-1k and CnC
#: papers', ``openood``: OpenOOD >= v1.5's and pytorch-ood's
FPR95_CONVENTIONS = {
    "paper": ("fpr95", "FPR@95 ID-pos", "OOD accepted at 95% ID recall (ID positive; the papers')"),
    "openood": ("fpr95_ood_positive", "FPR@95 OOD-pos", "ID rejected at 95% OOD recall (OOD positive; OpenOOD, pytorch-ood)"),
}


#: convention -> the AUPR columns it reports: ``paper``: average precision (oodeval's, the papers'),
#: ``openood``: the trapezoid over scikit-learn's precision-recall curve (OpenOOD, pytorch-ood)
AUPR_CONVENTIONS = {
    "paper": (("aupr_in", "AUPR-In AP"), ("aupr_out", "AUPR-Out AP")),
    "openood": (("aupr_in_trapezoid", "AUPR-In trapz"), ("aupr_out_trapezoid", "AUPR-Out trapz")),
}


def aupr_columns(lead: str = "paper") -> list[tuple[str, str]]:
    """The AUPR columns of :data:`AUPR_CONVENTIONS`, ``lead``'s first: (column, label)."""
    fpr95_columns(lead)  # the same conventions; refuses an unknown one
    return [*AUPR_CONVENTIONS[lead], *(c for k, v in AUPR_CONVENTIONS.items() if k != lead for c in v)]


def fpr95_columns(lead: str = "paper") -> list[tuple[str, str, str]]:
    """The two FPR@95 conventions of :data:`FPR95_CONVENTIONS`, ``lead`` first: (column, label, meaning)."""
    if lead not in FPR95_CONVENTIONS:
        raise InputError(f"convention must be one of {', '.join(FPR95_CONVENTIONS)}, got {lead!r}")
    return [FPR95_CONVENTIONS[lead]] + [v for k, v in FPR95_CONVENTIONS.items() if k != lead]


def check_scores(scores: object, name: str = "scores", ndim: int = 1) -> np.ndarray:
    """Return ``scores`` as a float64 array, raising ValueError for wrong shape, empty, complex or non-finite input."""
    if np.iscomplexobj(scores):
        raise InputError(f"{name} are complex numbers; scores must be real (higher = more in-distribution)")
    arr = np.asarray(scores, dtype=np.float64)
    if arr.ndim != ndim:
        raise InputError(f"{name} must be a {ndim}-d array, got shape {arr.shape}")
    if arr.size == 0 or arr.shape[-1] == 0:
        raise InputError(f"{name} is empty (shape {arr.shape}); at least one score is needed")
    bad = ~np.isfinite(arr)
    if bad.any():
        n_nan = int(np.isnan(arr).sum())
        raise InputError(
            f"{name} has {int(bad.sum())} non-finite values of {arr.size} "
            f"({n_nan} NaN, {int(bad.sum()) - n_nan} inf)"
        )
    return arr


def grouped_counts(id_scores: object, ood_scores: object) -> tuple[np.ndarray, np.ndarray]:
    """Counts of ID and OOD scores at each distinct score value, values in descending order.

    Returns ``(id_counts, ood_counts)``, two int64 arrays of equal length G.
    """
    x = check_scores(id_scores, "id_scores")
    y = check_scores(ood_scores, "ood_scores")
    values, inverse = np.unique(np.concatenate([x, y]), return_inverse=True)
    g = values.size
    id_counts = np.bincount(inverse[: x.size], minlength=g)[::-1]
    ood_counts = np.bincount(inverse[x.size :], minlength=g)[::-1]
    return id_counts.astype(np.int64), ood_counts.astype(np.int64)


def _k_for_tpr(n: int, tpr: float) -> int:
    """Smallest k with k / n >= tpr (the ROC rule, evaluated in floating point as the ROC does)."""
    if not 0.0 < tpr <= 1.0:
        raise InputError(f"tpr must lie in (0, 1], got {tpr}")
    k = max(1, math.ceil(tpr * n))
    while k > 1 and (k - 1) / n >= tpr:
        k -= 1
    while k / n < tpr:
        k += 1
    return k


# Grouped-count kernels. I and O are count arrays (..., G) in descending score order; every kernel
# is vectorised over the leading axes so that stats.py can pass (detectors, draws, G) at once.


def _fpr_from_counts(I: np.ndarray, O: np.ndarray, tpr: float) -> np.ndarray:
    cum_i = np.cumsum(I, axis=-1)
    cum_o = np.cumsum(O, axis=-1)
    n = cum_i[..., -1]
    m = cum_o[..., -1]
    k = np.vectorize(_k_for_tpr, otypes=[np.int64])(n, tpr)
    g = np.argmax(cum_i >= k[..., None], axis=-1)
    return np.take_along_axis(cum_o, g[..., None], axis=-1)[..., 0] / m


def _fpr_ood_positive_from_counts(I: np.ndarray, O: np.ndarray, tpr: float) -> np.ndarray:
    """FPR@tpr with OOD positive: the ID-positive rule on the counts in ascending score order."""
    return _fpr_from_counts(O[..., ::-1], I[..., ::-1], tpr)


def _auroc_from_counts(I: np.ndarray, O: np.ndarray) -> np.ndarray:
    cum_o = np.cumsum(O, axis=-1)
    n = I.sum(axis=-1)
    m = cum_o[..., -1]
    below = m[..., None] - cum_o
    wins = (I * (below + 0.5 * O)).sum(axis=-1, dtype=np.float64)
    return wins / (n.astype(np.float64) * m)


def _ap_from_counts(pos: np.ndarray, neg: np.ndarray) -> np.ndarray:
    cum_p = np.cumsum(pos, axis=-1)
    cum_n = np.cumsum(neg, axis=-1)
    total = cum_p + cum_n
    precision = np.divide(cum_p, total, out=np.zeros(total.shape), where=total > 0)
    return (pos * precision).sum(axis=-1) / cum_p[..., -1]


def _trapezoid_pr_from_counts(pos: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """Trapezoid under scikit-learn's precision-recall curve: one point per distinct score (a tie
    group enters at once), precision 0 where no positive is accepted yet, the point (recall 0,
    precision 1) added; the curve OpenOOD and pytorch-ood integrate."""
    cum_p = np.cumsum(pos, axis=-1).astype(np.float64)
    cum_n = np.cumsum(neg, axis=-1)
    precision = cum_p / (cum_p + cum_n)  # every prefix holds at least one score
    recall = cum_p / cum_p[..., -1:]
    prev_p = np.concatenate([np.ones(precision.shape[:-1] + (1,)), precision[..., :-1]], axis=-1)
    prev_r = np.concatenate([np.zeros(recall.shape[:-1] + (1,)), recall[..., :-1]], axis=-1)
    return ((recall - prev_r) * (precision + prev_p)).sum(axis=-1) / 2


def _detection_error_from_counts(I: np.ndarray, O: np.ndarray) -> np.ndarray:
    cum_i = np.cumsum(I, axis=-1)
    cum_o = np.cumsum(O, axis=-1)
    tpr = cum_i / cum_i[..., -1:]
    fpr = cum_o / cum_o[..., -1:]
    err = 0.5 * (1.0 - tpr) + 0.5 * fpr
    return np.minimum(err.min(axis=-1), 0.5)


def fpr_at_tpr(id_scores: object, ood_scores: object, tpr: float = 0.95) -> float:
    """FPR at TPR (ID positive): t = d_k, k = ceil(tpr * n) on ID scores sorted descending;
    the share of OOD scores >= t. Equals ``fpr[argmax(tpr_curve >= tpr)]`` of
    ``sklearn.metrics.roc_curve(..., drop_intermediate=False)`` with ID labelled 1.
    """
    I, O = grouped_counts(id_scores, ood_scores)
    return float(_fpr_from_counts(I, O, tpr))


def tnr_at_tpr(id_scores: object, ood_scores: object, tpr: float = 0.95) -> float:
    """TNR at TPR (the CnC paper's TNR@TPR95) = 1 - fpr_at_tpr."""
    return 1.0 - fpr_at_tpr(id_scores, ood_scores, tpr)


def fpr_ood_positive(id_scores: object, ood_scores: object, tpr: float = 0.95) -> float:
    """OpenOOD >= v1.5's and pytorch-ood's FPR@95: OOD is positive; the share of ID scores <= t,
    t the k-th lowest OOD score, k = ceil(tpr * m) (ID rejected at the threshold that detects
    ``tpr`` of the OOD scores). Not the papers' FPR@95 (see :func:`fpr_at_tpr`).
    """
    I, O = grouped_counts(id_scores, ood_scores)
    return float(_fpr_ood_positive_from_counts(I, O, tpr))


def auroc(id_scores: object, ood_scores: object) -> float:
    """AUROC with ID positive: Mann-Whitney U / (n m), a tie counting one half (= sklearn roc_auc_score)."""
    I, O = grouped_counts(id_scores, ood_scores)
    return float(_auroc_from_counts(I, O))


def aupr_in(id_scores: object, ood_scores: object) -> float:
    """Average precision with ID positive (= sklearn average_precision_score on the scores)."""
    I, O = grouped_counts(id_scores, ood_scores)
    return float(_ap_from_counts(I, O))


def aupr_out(id_scores: object, ood_scores: object) -> float:
    """Average precision with OOD positive, ranked by -score."""
    I, O = grouped_counts(id_scores, ood_scores)
    return float(_ap_from_counts(O[::-1], I[::-1]))


def aupr_in_trapezoid(id_scores: object, ood_scores: object) -> float:
    """AUPR-In as OpenOOD (``evaluators/metrics.py``: ``auc(recall_in, precision_in)`` of
    ``precision_recall_curve(ID = 1, score)``) and pytorch-ood 0.4 (``metrics.functional.aupr``,
    ``positive="id"``) compute it: the trapezoid under the precision-recall curve, ID positive.
    Not average precision (:func:`aupr_in`): the trapezoid interpolates precision linearly between
    the curve's points, which overstates it where a tie group or a run of one class spans a step."""
    I, O = grouped_counts(id_scores, ood_scores)
    return float(_trapezoid_pr_from_counts(I, O))


def aupr_out_trapezoid(id_scores: object, ood_scores: object) -> float:
    """AUPR-Out as OpenOOD and pytorch-ood compute it (:func:`aupr_in_trapezoid` with OOD positive, ranked by -score)."""
    I, O = grouped_counts(id_scores, ood_scores)
    return float(_trapezoid_pr_from_counts(O[::-1], I[::-1]))


def _autc_parts(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    lo = min(x.min(), y.min())
    hi = max(x.max(), y.max())
    if hi == lo:
        raise InputError("AUTC is undefined when every ID and OOD score is the same value")
    return lo, hi, hi - lo


def autc(id_scores: object, ood_scores: object) -> float:
    """Area under the threshold curve (Humblot-Renaux et al., "Beyond AUROC & co.", arXiv 2306.14658)
    as pytorch-ood 0.4 computes it (``metrics.functional.autc``): the scores min-max normalised over
    both sets to s in [0, 1] (here 1 = most in-distribution), then
    AUTC = (mean over ID of (1 - s) + mean over OOD of s) / 2, the mean area under the FPR and FNR
    curves over thresholds in [0, 1]. Lower is better; 0 separates perfectly at the extremes. The
    paper assumes scores already in [0, 1] and does not normalise; the min-max step is pytorch-ood's
    and is followed here so the numbers compare (a constant score set is refused). Ties do not matter.
    """
    x = check_scores(id_scores, "id_scores")
    y = check_scores(ood_scores, "ood_scores")
    lo, hi, span = _autc_parts(x, y)
    return float(((hi - x.mean()) / span + (y.mean() - lo) / span) / 2)


def _check_correct(id_scores: object, id_correct: object) -> tuple[np.ndarray, np.ndarray]:
    x = check_scores(id_scores, "id_scores")
    c = np.asarray(id_correct)
    if c.shape != x.shape:
        raise InputError(f"id_correct must have one entry per ID score ({x.shape}), got shape {c.shape}")
    if c.dtype != bool and not np.isin(c, (0, 1)).all():
        raise InputError("id_correct must be booleans (the classifier's prediction right or wrong), or 0/1")
    return x, c.astype(bool)


def _selective_counts(x: np.ndarray, correct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per distinct score (descending): the number of samples and of misclassified ones."""
    values, inverse = np.unique(x, return_inverse=True)
    total = np.bincount(inverse, minlength=values.size)[::-1].astype(np.float64)
    err = np.bincount(inverse, weights=~correct, minlength=values.size)[::-1]
    return total, err


def _aurc_augrc_from_counts(total: np.ndarray, err: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = total.sum(axis=-1, keepdims=True)
    cum_n = np.cumsum(total, axis=-1)
    cum_e = np.cumsum(err, axis=-1)
    coverage_step = total / n
    risk = np.divide(cum_e, cum_n, out=np.zeros(cum_n.shape), where=cum_n > 0)
    aurc_ = (coverage_step * risk).sum(axis=-1)
    gen = cum_e / n
    prev = np.concatenate([np.zeros(gen.shape[:-1] + (1,)), gen[..., :-1]], axis=-1)
    augrc_ = (coverage_step * (gen + prev) / 2).sum(axis=-1)
    return aurc_, augrc_


def aurc(id_scores: object, id_correct: object) -> float:
    """Area under the risk-coverage curve (Geifman, Uziel & El-Yaniv, "Bias-reduced uncertainty
    estimation", ICLR 2019): the ID samples accepted in descending score order, the selective risk
    at coverage k/n the error rate of the classifier among the k accepted; AURC = (1/n) sum_k risk(k).
    A tie group enters at once (the curve has one point per distinct score, as the failure-detection
    benchmarks' risk-coverage curves): each of its samples adds 1/n coverage at the risk after the
    whole group. ``id_correct``: whether the classifier's prediction on each ID sample is right.
    Lower is better; the score ranks the classifier's own errors (selective classification)."""
    x, c = _check_correct(id_scores, id_correct)
    return float(_aurc_augrc_from_counts(*_selective_counts(x, c))[0])


def augrc(id_scores: object, id_correct: object) -> float:
    """Area under the generalised risk-coverage curve (Traub et al., "Overcoming common flaws in the
    evaluation of selective classification systems", NeurIPS 2024): the generalised risk at a
    coverage is the share of all n ID samples that are accepted and misclassified; the area is the
    trapezoid through (0, 0) and one point per distinct score (a tie group enters at once), which is
    (1 - acc) (acc (1 - AUROC_f) + (1 - acc) / 2) with AUROC_f the AUROC of the score separating
    right from wrong predictions, ties counting one half. Lower is better."""
    x, c = _check_correct(id_scores, id_correct)
    return float(_aurc_augrc_from_counts(*_selective_counts(x, c))[1])


def selective_metrics(id_scores: object, id_correct: object) -> dict[str, float]:
    """``{"aurc", "augrc"}`` of the ID scores as confidences for the classifier's predictions."""
    x, c = _check_correct(id_scores, id_correct)
    a, g = _aurc_augrc_from_counts(*_selective_counts(x, c))
    return {"aurc": float(a), "augrc": float(g)}


def detection_error(id_scores: object, ood_scores: object) -> float:
    """min over all thresholds (both extremes included) of 0.5 (1 - TPR) + 0.5 FPR."""
    I, O = grouped_counts(id_scores, ood_scores)
    return float(_detection_error_from_counts(I, O))


def all_metrics(id_scores: object, ood_scores: object, tpr: float = 0.95) -> dict[str, float]:
    """All metrics in one pass (fractions): fpr95 (ID positive, the papers'), fpr95_ood_positive
    (OOD positive, OpenOOD / pytorch-ood), tnr95, auroc, aupr_in, aupr_out (average precision),
    detection_error, aupr_in_trapezoid, aupr_out_trapezoid (OpenOOD's / pytorch-ood's AUPR), autc
    (NaN when every score is one value)."""
    I, O = grouped_counts(id_scores, ood_scores)
    x, y = check_scores(id_scores, "id_scores"), check_scores(ood_scores, "ood_scores")
    fpr = float(_fpr_from_counts(I, O, tpr))
    return {
        "fpr95": fpr,
        "fpr95_ood_positive": float(_fpr_ood_positive_from_counts(I, O, tpr)),
        "tnr95": 1.0 - fpr,
        "auroc": float(_auroc_from_counts(I, O)),
        "aupr_in": float(_ap_from_counts(I, O)),
        "aupr_out": float(_ap_from_counts(O[::-1], I[::-1])),
        "detection_error": float(_detection_error_from_counts(I, O)),
        "aupr_in_trapezoid": float(_trapezoid_pr_from_counts(I, O)),
        "aupr_out_trapezoid": float(_trapezoid_pr_from_counts(O[::-1], I[::-1])),
        # AUTC is undefined when every score is one value (refused by :func:`autc`); NaN here
        "autc": autc(x, y) if x.min() != x.max() or (y != x[0]).any() else math.nan,
    }


#: the metrics a full-spectrum cell carries, as ``fs_<metric>`` columns
FULL_SPECTRUM = ("fpr95", "fpr95_ood_positive", "tnr95", "auroc", "aupr_in", "aupr_out", "detection_error",
                 "aupr_in_trapezoid", "aupr_out_trapezoid", "autc")


def full_spectrum_metrics(id_scores: object, csid_scores: Sequence[object], ood_scores: object, tpr: float = 0.95) -> dict[str, float]:
    """Full-spectrum OOD detection (OpenOOD v1.5's FSOOD mode; Yang et al., "Full-spectrum
    out-of-distribution detection", IJCV 2023): the covariate-shifted ID sets (ImageNet-V2/-C/-R,
    CIFAR-10-C) count as ID, so every metric of :func:`all_metrics` is computed with the ID side
    the ID-test scores followed by every csID set's scores (OpenOOD's ``evaluators/ood_evaluator.py``
    concatenates them the same way before ``compute_all_metrics``). Returns ``{"fs_<metric>": value}``
    for :data:`FULL_SPECTRUM`."""
    if not csid_scores:
        raise InputError("full-spectrum metrics need at least one covariate-shifted ID (csID) score set")
    joined = np.concatenate([check_scores(id_scores, "id_scores"),
                             *(check_scores(c, f"csid_scores[{i}]") for i, c in enumerate(csid_scores))])  # fmt: skip
    values = all_metrics(joined, ood_scores, tpr)
    return {f"fs_{m}": values[m] for m in FULL_SPECTRUM}


def accuracy(
    predictions: object,
    labels: object | Sequence[Iterable[int]],
) -> float:
    """Top-1 accuracy.

    ``predictions``: (N,) class indices or (N, C) logits/probabilities (argmax taken).
    ``labels``: (N,) int labels; or, for multi-label reannotations (ReImageNet style), a
    sequence of N label sets or an (N, C) boolean matrix. A prediction is correct when it lies
    in the set; samples whose set is empty have no valid label and are excluded.
    """
    pred = np.asarray(predictions)
    if pred.ndim == 2:
        pred = check_scores(pred, "predictions", ndim=2).argmax(axis=1)
    elif pred.ndim != 1:
        raise InputError(f"predictions must be (N,) indices or (N, C) scores, got shape {pred.shape}")
    if pred.size == 0:
        raise InputError("predictions is empty")
    n = pred.shape[0]
    if isinstance(labels, np.ndarray) and labels.dtype == bool:
        if labels.shape[0] != n or labels.ndim != 2:
            raise InputError(f"label matrix must be ({n}, C), got {labels.shape}")
        valid = labels.any(axis=1)
        if (pred[valid] >= labels.shape[1]).any():
            raise InputError("a prediction index exceeds the number of label columns")
        correct = labels[np.arange(n), np.minimum(pred, labels.shape[1] - 1)]
    elif isinstance(labels, np.ndarray) or (
        isinstance(labels, Sequence) and len(labels) > 0 and np.isscalar(labels[0])
    ):
        lab = np.asarray(labels)
        if lab.shape != (n,):
            raise InputError(f"labels must have shape ({n},) to match predictions, got {lab.shape}")
        valid = lab >= 0
        correct = pred == lab
    else:
        sets = [set(s) for s in labels]  # type: ignore[union-attr]
        if len(sets) != n:
            raise InputError(f"got {len(sets)} label sets for {n} predictions")
        valid = np.array([len(s) > 0 for s in sets])
        correct = np.array([int(p) in s for p, s in zip(pred, sets)])
    if not valid.any():
        raise InputError("no sample has a valid label")
    return float(correct[valid].mean())
