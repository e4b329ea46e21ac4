"""The results table of an experiment: one Parquet file, one row per evaluated cell.

A cell is keyed by :data:`KEY` = (model, weights, detector, hyperparameters, dataset, split, seed);
``hyperparameters`` is the detector's overrides as key-sorted JSON (``"{}"`` for the defaults);
``hyperparameters_resolved`` is every hyperparameter the detector ran with (its backbone's
release defaults under those overrides, ``oodeval.detectors.defaults``) and ``backbone`` the
backbone family they were resolved for.
Metric columns are fractions in [0, 1] (``oodeval.metrics``); the bootstrapped ones carry
``<metric>_lo`` / ``<metric>_hi`` percentile 95% bounds. A failed cell has ``status == "error"``
and its message in ``error``; its metrics are NaN. Per-cell scores live beside the table
(``scores_id`` / ``scores_ood`` are paths relative to the table's folder).

Every write replaces the whole file through :func:`oodeval._io.atomic_path`, so readers (pandas,
DuckDB, pyarrow) never see a half-written table; an existing file is replaced only when it is
a results table itself (anything else at the path is refused).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from ._io import atomic_path, parquet_has_columns

__all__ = [
    "KEY",
    "METRICS",
    "BOOTSTRAPPED",
    "COLUMNS",
    "ALL_SPLIT",
    "hp_json",
    "empty_results",
    "load_results",
    "save_results",
    "merge_results",
    "done_keys",
    "load_cell_scores",
]

KEY = ("model", "weights", "detector", "hyperparameters", "dataset", "split", "seed")
METRICS = ("fpr95", "tnr95", "auroc", "aupr_in", "aupr_out", "detection_error")
BOOTSTRAPPED = ("fpr95", "tnr95", "auroc", "detection_error")
#: recognises an existing results table, the only file :func:`save_results` replaces
is_results_table = parquet_has_columns(*KEY)
#: the ``split`` value of a cell over the whole OOD set
ALL_SPLIT = "all"

_INFO = {
    "label": "string",
    "kind": "string",
    "backbone": "string",
    "hyperparameters_resolved": "string",
    "vocabulary": "string",
    "id_train": "string",
    "id_test": "string",
    "status": "string",
    "error": "string",
    "n_id": "Int64",
    "n_ood": "Int64",
    "id_accuracy": "float64",
    "bootstrap_draws": "Int64",
    "bootstrap_fixed_id": "boolean",
    "selection": "string",
    "scores_id": "string",
    "scores_ood": "string",
    "seconds": "float64",
    "created": "string",
}
_KEY_TYPES = {k: ("int64" if k == "seed" else "string") for k in KEY}
COLUMNS: dict[str, str] = {
    **_KEY_TYPES,
    **{m: "float64" for m in METRICS},
    **{f"{m}_{b}": "float64" for m in BOOTSTRAPPED for b in ("lo", "hi")},
    **_INFO,
}


def hp_json(hyperparameters: dict | None) -> str:
    """Canonical JSON of a detector's hyperparameter overrides (sorted keys, no spaces)."""
    return json.dumps(hyperparameters or {}, sort_keys=True, separators=(",", ":"), default=str)


def empty_results() -> pd.DataFrame:
    """A results table with every column and no rows."""
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in COLUMNS.items()})


_DTYPES = {c: pd.api.types.pandas_dtype(t) for c, t in COLUMNS.items()}


def _conform(df: pd.DataFrame) -> pd.DataFrame:
    """Add missing columns (as missing values) and cast every known column to its dtype."""
    df = df.copy()
    for col, dtype in COLUMNS.items():
        if col not in df.columns:
            df[col] = np.nan if dtype == "float64" else pd.Series([pd.NA] * len(df), dtype=dtype, index=df.index)
        elif df[col].dtype != _DTYPES[col]:
            df[col] = df[col].astype(dtype)
    extra = [c for c in df.columns if c not in COLUMNS]
    return df[list(COLUMNS) + extra].reset_index(drop=True)


def load_results(path: str | Path) -> pd.DataFrame:
    """The table at ``path`` (an empty table when the file does not exist yet)."""
    path = Path(path)
    if not path.exists():
        return empty_results()
    if path.is_dir():
        raise ValueError(f"results path {path} is a folder; expected a .parquet file")
    df = pd.read_parquet(path)
    missing = [k for k in KEY if k not in df.columns]
    if missing:
        raise ValueError(f"{path} is not an oodeval results table: it lacks key column(s) {', '.join(missing)}")
    return _conform(df)


def save_results(df: pd.DataFrame, path: str | Path) -> Path:
    """Write ``df`` to ``path`` as Parquet atomically (temporary file, then one rename)."""
    path = Path(path)
    df = _conform(df)
    with atomic_path(path, "results table", is_results_table) as tmp:
        df.to_parquet(tmp, index=False)
    return path


def merge_results(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """``old`` with the rows of ``new`` added; a row of ``new`` replaces an ``old`` row with the same key."""
    if len(new) == 0:
        return _conform(old)
    if len(old) == 0:
        return _conform(new)
    both = pd.concat([_conform(old), _conform(new)], ignore_index=True)
    return both.drop_duplicates(subset=list(KEY), keep="last").reset_index(drop=True)


def done_keys(df: pd.DataFrame, include_errors: bool = False) -> set[tuple]:
    """Keys of the cells already computed (status ``ok``; failed ones too if ``include_errors``)."""
    if len(df) == 0:
        return set()
    rows = df if include_errors else df[df["status"] == "ok"]
    return {_key_of(r) for r in rows[list(KEY)].itertuples(index=False, name=None)}


def _key_of(values: tuple) -> tuple:
    return tuple(int(v) if k == "seed" else str(v) for k, v in zip(KEY, values))


def load_cell_scores(row: pd.Series | dict, results_path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """The (ID scores, OOD scores) of one ok row, read from the files beside ``results_path``."""
    base = Path(results_path).parent
    if row.get("status") != "ok" or pd.isna(row.get("scores_id")) or pd.isna(row.get("scores_ood")):
        raise ValueError(f"row {row.get('detector')}/{row.get('dataset')} has no stored scores")
    return np.load(base / row["scores_id"]), np.load(base / row["scores_ood"])
