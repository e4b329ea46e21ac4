"""The ID-train rows NAC fits on, chosen from the labels alone (numpy only).

NAC (:mod:`oodeval.detectors.nac`) fits on these rows and the extraction of its fitting set
(``features.extract.extract_nac_fit``) taps exactly them, so they are chosen here, in the features
layer below the detectors.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError

__all__ = ["fit_rows"]


def fit_rows(labels: np.ndarray, n_fit: int | None, seed: int) -> np.ndarray:
    """The sorted ID-train rows NAC fits on: all when ``n_fit`` is None or >= N, else
    floor(n_fit / K) rows per class (capped by the smallest class), drawn with ``seed``; the
    release's class-balanced ``valid_num`` subset. Unlabelled data: n_fit rows at random.
    """
    labels = np.asarray(labels)
    n = labels.shape[0]
    if n_fit is None or n_fit >= n:
        return np.arange(n)
    if n_fit < 1:
        raise InputError(f"nac n_fit must be >= 1 (or None for all rows), got {n_fit}")
    rng = np.random.default_rng(seed)
    classes = np.unique(labels[labels >= 0])
    if classes.size == 0:
        return np.sort(rng.choice(n, size=int(n_fit), replace=False))
    if n_fit < classes.size:
        raise InputError(
            f"nac n_fit={n_fit} is below the {classes.size} classes of the train set: a class-balanced "
            f"subset needs at least one row per class (use n_fit >= {classes.size}, or None for all rows)"
        )
    members = [np.flatnonzero(labels == c) for c in classes]
    per = min(min(len(m) for m in members), int(n_fit) // classes.size)
    return np.sort(np.concatenate([rng.choice(m, size=per, replace=False) for m in members]))
