"""The test-time protocol of zero-shot scorers that adapt to the images they have seen (AdaNeg).

A test-time scorer's score of an image depends on the images before it, so the stream is a stated
setting, recorded with every result:

- ``order``: the seed of the stream's order, ``numpy.random.default_rng(order).permutation``;
- ``id_share``: the fraction of ID images in the stream. None (default, the papers' protocol: the
  AdaNeg release streams every ID test image with every image of one OOD set, shuffled) keeps both
  sets whole; a value subsamples the larger set (seeded by ``order``) so that n_ID / (n_ID + n_OOD)
  is ``id_share`` up to rounding;
- ``batch_size``: images scored at once (the scorer's hyperparameter; AdaNeg's default 256);
- state is rebuilt for every (ID, OOD set) stream: nothing carries over between OOD sets.

The scorer sees the stream's embeddings only: which rows are ID is used to build the mix and to split
the scores for the metrics, never by the scorer. :func:`over_orders` repeats the evaluation over
orders 0..n-1 and :func:`spread` summarises a metric over them (mean, min, max and a Student-t 95%
interval of the mean over orders).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats as sps

from ..errors import InputError
from ..features import FeatureSet
from ..metrics import all_metrics

__all__ = ["Protocol", "is_test_time", "stream_order", "score_labelled", "score_pair", "over_orders", "spread"]


@dataclass(frozen=True)
class Protocol:
    """How the stream of one (ID, OOD) evaluation is formed (module docstring)."""

    order: int = 0
    id_share: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.order, bool) or not isinstance(self.order, (int, np.integer)) or self.order < 0:
            raise InputError(f"order must be an integer >= 0, got {self.order!r}")
        if self.id_share is not None and not 0 < self.id_share < 1:
            raise InputError(f"id_share must lie in (0, 1) or be None (both sets whole), got {self.id_share!r}")

    def record(self) -> dict:
        """The settings as a dict, for results tables and JSON."""
        return asdict(self)


def is_test_time(scorer: object) -> bool:
    """Whether a scorer (class or instance) adapts to the stream it scores."""
    return bool(getattr(scorer, "test_time", False))


def stream_order(is_id: np.ndarray, protocol: Protocol) -> np.ndarray:
    """Rows of a pooled ID + OOD set in stream order: the kept rows (all, or the ``id_share`` mix)
    permuted by ``default_rng(protocol.order)``. ``is_id`` only chooses the mix: with
    ``id_share=None`` the order depends on the number of rows alone."""
    is_id = np.asarray(is_id, dtype=bool)
    ids, oods = np.flatnonzero(is_id), np.flatnonzero(~is_id)
    if len(ids) < 1 or len(oods) < 1:
        raise InputError(f"a test-time stream needs ID and OOD images, got {len(ids)} and {len(oods)}")
    rng = np.random.default_rng(protocol.order)
    if protocol.id_share is None:
        kept = np.arange(len(is_id))
    else:
        share = protocol.id_share
        want_ood = int(round(len(ids) * (1 - share) / share))
        if want_ood <= len(oods):
            oods = np.sort(rng.choice(oods, size=max(1, want_ood), replace=False))
        else:
            ids = np.sort(rng.choice(ids, size=max(1, min(len(ids), int(round(len(oods) * share / (1 - share))))), replace=False))
        kept = np.sort(np.concatenate([ids, oods]))
    return kept[rng.permutation(len(kept))]


def score_labelled(scorer, pool: np.ndarray, is_id: np.ndarray, id_text: np.ndarray, negatives: np.ndarray | None,
                   protocol: Protocol = Protocol(), normalize: bool = False) -> np.ndarray:
    """Scores (float64, one per row of ``pool``; NaN for rows the mix left out) from one stream with
    fresh state: the scorer gets the embeddings in stream order and the label embeddings, nothing else."""
    order = stream_order(is_id, protocol)
    out = np.full(len(pool), np.nan)
    out[order] = scorer.score(np.asarray(pool[order], dtype=np.float64), id_text, negatives, normalize=normalize)
    return out


def _rows(fs: FeatureSet | np.ndarray) -> np.ndarray:
    return np.asarray(fs.features if isinstance(fs, FeatureSet) else fs)


def score_pair(scorer, id_image, ood_image, id_text: np.ndarray, negatives: np.ndarray | None,
               protocol: Protocol = Protocol(), normalize: bool = False) -> tuple[np.ndarray, np.ndarray, dict]:
    """Scores of the streamed ID and OOD images (in their sets' row order; the mix's left-out rows
    dropped) from one stream of the two sets with fresh state, and ``info``: the protocol, the batch
    size and the counts, to record with the result."""
    x_id, x_ood = _rows(id_image), _rows(ood_image)
    is_id = np.r_[np.ones(len(x_id), bool), np.zeros(len(x_ood), bool)]
    scores = score_labelled(scorer, np.concatenate([x_id, x_ood]), is_id, id_text, negatives, protocol, normalize)
    s_id, s_ood = scores[: len(x_id)], scores[len(x_id) :]
    s_id, s_ood = s_id[~np.isnan(s_id)], s_ood[~np.isnan(s_ood)]
    info = {**protocol.record(), "batch_size": getattr(scorer, "batch_size", None), "n_id": len(s_id), "n_ood": len(s_ood)}
    return s_id, s_ood, info


def over_orders(scorer, id_image, ood_image, id_text, negatives, orders: int = 5, id_share: float | None = None,
                normalize: bool = False) -> list[dict]:
    """Metrics (``metrics.all_metrics``) and settings of one evaluation per order 0..orders-1."""
    if orders < 1:
        raise InputError(f"orders must be >= 1, got {orders}")
    out = []
    for k in range(orders):
        s_id, s_ood, info = score_pair(scorer, id_image, ood_image, id_text, negatives, Protocol(k, id_share), normalize)
        out.append({**info, **all_metrics(s_id, s_ood)})
    return out


def spread(values, level: float = 0.95) -> dict:
    """mean, min, max, and the Student-t interval of the mean at ``level`` over the orders' values
    (the interval is the point itself for one order)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        raise InputError("no values to summarise")
    mean = float(v.mean())
    if v.size == 1:
        lo = hi = mean
    else:
        half = float(sps.t.ppf((1 + level) / 2, v.size - 1) * v.std(ddof=1) / np.sqrt(v.size))
        lo, hi = mean - half, mean + half
    return {"mean": mean, "min": float(v.min()), "max": float(v.max()), "ci_low": lo, "ci_high": hi, "n": int(v.size)}
