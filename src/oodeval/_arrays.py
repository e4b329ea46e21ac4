"""Row chunks and row normalisation shared by the detectors, the zero-shot scorers and the
construction evidence (numpy only, so every layer can import it).

A pass over an (N, D) matrix reads ``chunk_rows(D)`` rows at a time, so its float64 work arrays
stay near ``CHUNK_ELEMENTS`` values (~32 MB) whatever N.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

__all__ = ["CHUNK_ELEMENTS", "MIN_CHUNK_ROWS", "chunk_rows", "chunks", "l2_normalise"]

#: float64 elements per chunk (~32 MB); rows per chunk = this / row width.
CHUNK_ELEMENTS = 4_000_000
#: fewest rows per chunk
MIN_CHUNK_ROWS = 256


def chunk_rows(width: int) -> int:
    """Rows per chunk for a row width of ``width`` values (at least MIN_CHUNK_ROWS)."""
    return max(MIN_CHUNK_ROWS, CHUNK_ELEMENTS // max(1, int(width)))


def chunks(n: int, width: int) -> Iterator[slice]:
    """Consecutive row slices covering ``range(n)``."""
    step = chunk_rows(width)
    for start in range(0, n, step):
        yield slice(start, min(n, start + step))


def l2_normalise(z: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Rows divided by their Euclidean norm (rows of norm 0 stay 0)."""
    norm = np.linalg.norm(z, axis=1, keepdims=True)
    return z / np.maximum(norm, eps)
