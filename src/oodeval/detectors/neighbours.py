"""Nearest-neighbour detectors: deep kNN and NNGuide (exact search through faiss IndexFlatIP).

Banks are l2-normalised float32 rows added to the index in chunks, so fitting never holds more
than the index (one float32 copy of the bank) plus one chunk. Queries run in chunks too.
"""

from __future__ import annotations

from collections.abc import Iterator

import faiss
import numpy as np

from ..features import FeatureSet
from . import register
from ._common import chunks, energy, l2_normalise
from .base import Detector

__all__ = ["KNN", "NNGuide"]

#: queries per faiss search call (bounds the (q, k) result arrays)
QUERY_CHUNK = 4096


def _normalised32(z: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(l2_normalise(np.asarray(z, dtype=np.float32)), dtype=np.float32)


def _flat_ip(d: int, rows, n: int) -> faiss.IndexFlatIP:
    index = faiss.IndexFlatIP(d)
    for sl in chunks(n, d):
        index.add(np.ascontiguousarray(rows(sl), dtype=np.float32))
    return index


def _search(index: faiss.IndexFlatIP, z: np.ndarray, k: int) -> Iterator[np.ndarray]:
    """Top-k inner products (descending) of the l2-normalised rows of z, one query chunk at a time."""
    for start in range(0, len(z), QUERY_CHUNK):
        sims, _ = index.search(_normalised32(z[start : start + QUERY_CHUNK]), k)
        yield sims.astype(np.float64)


@register("knn")
class KNN(Detector):
    """Deep kNN: s = -|| z/|z| - b_(k) ||, the distance to the k-th nearest normalised ID-train feature.

    Sun et al., "Out-of-distribution detection with deep nearest neighbors", ICML 2022. Bank:
    every ID-train feature, l2-normalised (the paper's alpha = 100%). Exact search with faiss
    IndexFlatIP; distance = sqrt(2 - 2 cos). Default k = 1000, the paper's ImageNet setting
    (1.28M bank); the paper uses k = 50 for CIFAR-10 (50k bank). Choose k roughly in proportion
    to the bank (about 1 per 1000 train images) or tune it on held-out ID data; k must not exceed
    the bank size. ``bank_fraction`` < 1 keeps a seeded random subset (the paper's alpha).
    Older pytorch-ood KNN versions did not normalise and used k = 1 (0.4.0 normalises, k = 50).
    """

    needs = ("features",)
    fit_needs = ("features",)

    def __init__(self, k: int = 1000, bank_fraction: float = 1.0, seed: int = 0) -> None:
        self.k = k
        self.bank_fraction = bank_fraction
        self.seed = seed

    def _fit(self, train: FeatureSet) -> None:
        z = train.features
        subset = _bank_rows(len(z), self.bank_fraction, self.seed, int(self.k), "knn")
        self.bank_index_ = np.arange(len(z)) if subset is None else subset
        if subset is None:
            self.index_ = _flat_ip(z.shape[1], lambda sl: _normalised32(z[sl]), len(z))
        else:
            self.index_ = _flat_ip(z.shape[1], lambda sl: _normalised32(z[subset[sl]]), len(subset))

    def _score(self, x: FeatureSet) -> np.ndarray:
        sims = np.concatenate([s[:, -1] for s in _search(self.index_, x.features, int(self.k))])
        return -np.sqrt(np.maximum(2.0 - 2.0 * sims, 0.0))


def _bank_rows(n: int, fraction: float, seed: int, k: int, who: str) -> np.ndarray | None:
    """Sorted seeded random subset of ceil(fraction n) rows (None = all rows); checks k."""
    if not 0 < fraction <= 1:
        raise ValueError(f"{who} bank_fraction must be in (0, 1], got {fraction}")
    if k < 1:
        raise ValueError(f"{who} needs k >= 1, got {k}")
    size = n if fraction == 1 else max(k, int(np.ceil(fraction * n)))
    if k > size:
        raise ValueError(
            f"{who} k={k} exceeds the {size}-sample bank ({n} train rows, bank_fraction={fraction}); "
            "use a smaller k (e.g. k=50 as for CIFAR-10)"
        )
    if size >= n:
        return None
    return np.sort(np.random.default_rng(seed).choice(n, size=size, replace=False))


@register("nnguide")
class NNGuide(Detector):
    """NNGuide: s = E(x) * mean of the top-k of <z/|z|, E(b) b/|b|> over a bank b of ID train.

    Park et al., "Nearest neighbor guidance for OOD detection", ICCV 2023. E = energy
    logsumexp(f). The bank is a seeded uniform random subset of ID train (``bank_fraction``
    default 0.01, the paper's ImageNet setting; at least k rows), each row l2-normalised and
    multiplied by its own energy; the guidance is the mean of the k largest inner products
    with that weighted bank (k = 10, the paper's default), exactly as the release ranks them.
    Banks drawn in loader order (as some forks do) are not random; here the seed decides.
    This is plain NNGuide; the release's ImageNet ResNet-50 setting additionally clips the
    features at their ID-train 95th percentile (ReAct) first, which is not implemented.
    """

    needs = ("features", "logits")
    fit_needs = ("features", "logits")

    def __init__(self, k: int = 10, bank_fraction: float = 0.01, seed: int = 0) -> None:
        self.k = k
        self.bank_fraction = bank_fraction
        self.seed = seed

    def _fit(self, train: FeatureSet) -> None:
        z, f = train.features, train.logits
        idx = _bank_rows(len(z), self.bank_fraction, self.seed, int(self.k), "nnguide")
        self.bank_index_ = np.arange(len(z)) if idx is None else idx

        def rows(sl: slice) -> np.ndarray:
            i = self.bank_index_[sl]
            return _normalised32(z[i]) * energy(f[i])[:, None].astype(np.float32)

        self.index_ = _flat_ip(z.shape[1], rows, len(self.bank_index_))

    def _score(self, x: FeatureSet) -> np.ndarray:
        guidance = np.concatenate([s.mean(axis=1) for s in _search(self.index_, x.features, int(self.k))])
        f = x.logits
        conf = np.concatenate([energy(f[sl]) for sl in chunks(len(f), f.shape[1])])
        return conf * guidance
