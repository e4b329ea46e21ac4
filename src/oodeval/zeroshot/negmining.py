"""NegMining (NegLabel, Jiang et al. ICLR 2024, Sec. 3.2 and released code).

Each candidate label j gets d_j = the eta-th percentile over ID classes c of cos(t^_j, t_c)
(eta = 95, numpy's linear interpolation like ``torch.quantile``); the M candidates with the smallest
d_j are kept, least ID-like first, ties broken by the label string, so the order is deterministic and
every prefix of it is the NegMining result for a smaller M. The paper uses M = 5000 (NegLabel: 10000).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import InputError

__all__ = ["percentile_similarity", "rank_candidates", "negmine"]


def percentile_similarity(candidates: np.ndarray, id_text: np.ndarray, percentile: float = 95.0, chunk: int = 4096) -> np.ndarray:
    """d_j = percentile_c cos(candidate_j, id_c), float64 (K,), in row chunks."""
    candidates = np.asarray(candidates)
    id_text = np.asarray(id_text, dtype=np.float64)
    if candidates.ndim != 2 or id_text.ndim != 2 or candidates.shape[1] != id_text.shape[1]:
        raise InputError(f"need candidates (K, E) and ID embeddings (C, E); got {candidates.shape} and {id_text.shape}")
    if not 0 <= percentile <= 100:
        raise InputError(f"percentile must be in [0, 100], got {percentile}")
    out = np.empty(len(candidates))
    for start in range(0, len(candidates), chunk):
        sims = np.asarray(candidates[start : start + chunk], dtype=np.float64) @ id_text.T
        out[start : start + chunk] = np.percentile(sims, percentile, axis=1)
    return out


def rank_candidates(labels: Sequence[str], candidates: np.ndarray, id_text: np.ndarray, percentile: float = 95.0) -> tuple[list[str], np.ndarray]:
    """All candidates ordered least ID-like first (by d_j, then label); returns (labels, d sorted)."""
    if len(labels) != len(candidates):
        raise InputError(f"{len(labels)} labels but {len(candidates)} candidate embeddings")
    d = percentile_similarity(candidates, id_text, percentile)
    order = np.lexsort((np.asarray(labels, dtype=str), d))
    return [labels[i] for i in order], d[order]


def negmine(labels: Sequence[str], candidates: np.ndarray, id_text: np.ndarray, m: int = 5000, percentile: float = 95.0) -> list[str]:
    """The ``m`` candidate labels least similar to the ID names (all of them when fewer)."""
    if m < 0:
        raise InputError(f"M must be >= 0, got {m}")
    ranked, _ = rank_candidates(labels, candidates, id_text, percentile)
    return ranked[:m]
