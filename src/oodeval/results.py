"""The results table of an experiment: one Parquet file, one row per evaluated cell.

A cell is keyed by a :class:`CellKey` (:data:`KEY` = model, weights, detector, hyperparameters,
dataset, split, seed); ``hyperparameters`` is the detector's explicit overrides as key-sorted JSON
(``"{}"`` for the defaults), in every table oodeval writes;
``hyperparameters_resolved`` is every hyperparameter the detector ran with (its backbone's
release defaults under those overrides, ``oodeval.detectors.defaults``) and ``backbone`` the
backbone family they were resolved for. ``vocabulary_source`` (JSON) records what made a zero-shot
cell's vocabulary file: its kind and content hash and, for an LLM vocabulary, the prompt file
(``"oodeval default"`` for oodeval's own wording, else e.g. EOE's released prompts), a hash of the
prompt texts, the LLM and the generation.
Metric columns are fractions in [0, 1] (``oodeval.metrics``; ``fpr95`` is the papers' FPR@95, ID
positive, ``fpr95_ood_positive`` the OpenOOD / pytorch-ood one; ``aupr_in`` / ``aupr_out`` average
precision, ``aupr_in_trapezoid`` / ``aupr_out_trapezoid`` OpenOOD's and pytorch-ood's trapezoid;
``autc``; ``aurc`` / ``augrc`` of the detector's ID scores as the classifier's confidence, NaN
without ID logits and labels; a column a table was written before is NaN when it is read); with
covariate-shifted ID sets (full-spectrum OOD, :func:`oodeval.metrics.full_spectrum_metrics`) also
``fs_<metric>`` (no CIs), ``csid`` (the csID labels, comma-separated) and ``csid_accuracy`` (JSON:
label -> ID accuracy on that set); the bootstrapped ones carry
``<metric>_lo`` / ``<metric>_hi`` percentile 95% bounds. A failed cell has ``status == "error"``
and its message in ``error``; its metrics are NaN. ``random_init`` is true where the model's
features came from random weights (``pretrained = false``, or a FeatureSet whose meta says so). Per-cell scores live beside the table
(``scores_id`` / ``scores_ood`` are paths relative to the table's folder).

:func:`result_row` is the one row definition: the results table's rows (``oodeval run``,
``score --out X.parquet``, ``cnc evaluate --results``) and the score table's (``oodeval score``'s
rows and CSV, ``oodeval.evaluate``'s DataFrame, :data:`SCORE_COLUMNS`: the same columns without the
key's model, weights, split and seed, the OOD set named ``ood``) are built by it from a cell of
:func:`oodeval.evaluation.fit_score_evaluate` and the :class:`oodeval.scorer_factory.Scorer` that made it.

On disk a table is a Parquet dataset of parts: the main file at the table's path plus the
part files under ``<stem>.parts/`` beside it. Each writer (one detector fit of the in-process
grid, one job of a Slurm or local executor) adds its rows as a new part file, written
atomically under a unique name, so any number of processes write concurrently and nothing is
lost; :func:`load_results` merges the main file and every part (a later row replaces an earlier
one with the same key), and :func:`compact_results` folds the parts into the main file (under a
lock, deleting only the parts it folded in). Every file is replaced through
:func:`oodeval._io.atomic_path`, so readers (pandas, DuckDB, pyarrow) never see a half-written one;
an existing file is replaced only when it is a results table itself (anything else is refused).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from ._extras import needs
from ._io import claim_folder, write_parquet_atomic
from .errors import InputError, StateError
from .metrics import FULL_SPECTRUM

__all__ = [
    "CellKey",
    "KEY",
    "SCORE_COLUMNS",
    "result_row",
    "METRICS",
    "BOOTSTRAPPED",
    "COLUMNS",
    "ALL_SPLIT",
    "hp_json",
    "empty_results",
    "load_results",
    "save_results",
    "write_part",
    "compact_results",
    "parts_dir",
    "PARTS_KIND",
    "merge_results",
    "done_keys",
    "load_cell_scores",
    "missing_cell_scores",
]



class CellKey(NamedTuple):
    """The key of one cell of a results table (a tuple: compares, hashes and unpacks as one)."""

    model: str
    weights: str
    detector: str
    hyperparameters: str
    dataset: str
    split: str
    seed: int

    def without_split(self) -> tuple:
        """The key with its split left out: the cell over the whole set and its split cells share it."""
        return self[:5] + self[6:]


KEY = CellKey._fields
METRICS = ("fpr95", "fpr95_ood_positive", "tnr95", "auroc", "aupr_in", "aupr_out", "detection_error",
           "aupr_in_trapezoid", "aupr_out_trapezoid", "autc", "aurc", "augrc")
BOOTSTRAPPED = ("fpr95", "fpr95_ood_positive", "tnr95", "auroc", "detection_error", "autc", "aurc", "augrc")
#: the oodeval output kind of a table's parts folder
PARTS_KIND = "results parts"
#: the ``split`` value of a cell over the whole OOD set
ALL_SPLIT = "all"

_INFO = {
    "label": "string",
    "kind": "string",
    "backbone": "string",
    "hyperparameters_resolved": "string",
    "vocabulary": "string",
    "vocabulary_source": "string",
    "id_train": "string",
    "id_test": "string",
    "status": "string",
    "error": "string",
    "n_id": "Int64",
    "n_ood": "Int64",
    "id_accuracy": "float64",
    "bootstrap_draws": "Int64",
    "bootstrap_fixed_id": "boolean",
    "random_init": "boolean",
    "inputs": "string",
    "selection": "string",
    "stream": "string",
    "scores_id": "string",
    "scores_ood": "string",
    "seconds": "float64",
    "fit_seconds": "float64",
    "score_seconds": "float64",
    "ci_resamples": "string",
    "csid": "string",
    "csid_accuracy": "string",
    "created": "string",
}
_KEY_TYPES = {k: ("int64" if k == "seed" else "string") for k in KEY}
COLUMNS: dict[str, str] = {
    **_KEY_TYPES,
    **{m: "float64" for m in METRICS},
    **{f"{m}_{b}": "float64" for m in BOOTSTRAPPED for b in ("lo", "hi")},
    **{f"fs_{m}": "float64" for m in FULL_SPECTRUM},
    **_INFO,
}


#: the score table's columns (``oodeval score``, ``oodeval.evaluate``): a results row's without the
#: key's model, weights, split and seed, the OOD set named ``ood``
SCORE_COLUMNS = ("detector", "ood", "hyperparameters", *(c for c in COLUMNS if c not in KEY))


def result_row(cell: Mapping, scorer=None, key: CellKey | None = None, *, resolved: bool = True, **columns) -> dict:
    """One row of a results table (``key`` given: its columns, then ``cell``'s but ood, split and
    seed) or of the score table (no ``key``: detector and ood first, :data:`SCORE_COLUMNS`, then
    the rest of ``cell``).

    ``cell`` is a row of :func:`oodeval.evaluation.fit_score_evaluate` (or ``{"status": "error",
    "error": ...}``). ``scorer`` (the :class:`oodeval.scorer_factory.Scorer` that made it; None where none
    was built) gives the ``backbone``, the explicit ``hyperparameters`` (JSON; a results row takes
    its key's, which also name a vocabulary or a search) and, with ``resolved``,
    ``hyperparameters_resolved``: every hyperparameter it ran with. ``columns`` are further columns
    of :data:`COLUMNS` (an unknown name is refused); a writer's own provenance columns (the CnC
    training's) are added by that writer to its table.
    """
    head = dict(key._asdict()) if key is not None else {"detector": scorer.name, "ood": cell["ood"]}
    drop = {"ood", *head} | (set(KEY) if key is not None else set())
    row = {**head, **{k: v for k, v in cell.items() if k not in drop}}
    if scorer is not None:
        row["backbone"] = scorer.backbone
        if key is None:
            row["hyperparameters"] = hp_json(scorer.hyperparameters)
        if resolved:
            row["hyperparameters_resolved"] = hp_json(scorer.resolved())
    row.update(columns)
    unknown = sorted(set(row) - set(COLUMNS) - {"ood"})
    if unknown:
        raise StateError(f"result_row: {unknown} are not columns of a results table (oodeval.results.COLUMNS)")
    return row


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


def parts_dir(path: str | Path) -> Path:
    """The folder of the table's part files, ``<stem>.parts`` beside it."""
    path = Path(path)
    return path.parent / f"{path.stem}.parts"


def _part_files(path: Path) -> list[Path]:
    """Part files in write order (names start with the nanosecond time of writing)."""
    folder = parts_dir(path)
    return sorted(folder.glob("part-*.parquet")) if folder.is_dir() else []


def _read_table(path: Path) -> pd.DataFrame:
    try:
        with needs():  # pyarrow is the results extra
            df = pd.read_parquet(path)
    except (FileNotFoundError, ImportError):
        raise
    except Exception as exc:  # noqa: BLE001 - pyarrow raises its own types for a damaged file
        raise InputError(f"results table {path} is damaged: it cannot be read as Parquet ({type(exc).__name__}: {exc}); "
                         "restore it from a copy, or move it away and rerun to recompute its cells") from exc
    missing = [k for k in KEY if k not in df.columns]
    if missing:
        raise InputError(f"{path} is not an oodeval results table: it lacks key column(s) {', '.join(missing)}")
    return _conform(df)


def load_results(path: str | Path) -> pd.DataFrame:
    """The table at ``path``: its main file merged with its parts (an empty table when neither
    exists yet). A part folded into the main file while being read triggers a re-read."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"results path {path} is a folder; expected a .parquet file")
    for _ in range(10):
        parts = _part_files(path)
        try:
            frames = [_read_table(path)] if path.exists() else []
            frames += [_read_table(p) for p in parts]
        except FileNotFoundError:  # a concurrent compact_results folded a part in: read again
            continue
        return _merge_all(frames)
    raise StateError(f"{path}: parts kept disappearing while reading (10 attempts)")


def write_part(df: pd.DataFrame, path: str | Path) -> Path | None:
    """Add the rows of ``df`` to the table at ``path`` as a new part file (atomic, uniquely
    named, safe with any number of concurrent writers); None when ``df`` has no rows."""
    if len(df) == 0:
        return None
    name = f"part-{time.time_ns():020d}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}.parquet"
    return save_results(df, claim_folder(parts_dir(path), PARTS_KIND) / name)


def compact_results(path: str | Path) -> bool:
    """Fold the table's part files into its main file (atomically) and delete those parts.

    Holds an exclusive lock on the parts folder, so two compactions never interleave; parts
    written meanwhile are left for the next compaction. False when there was nothing to fold.
    """
    path = Path(path)
    folder = parts_dir(path)
    if not folder.is_dir():
        return False
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        parts = _part_files(path)
        if not parts:
            return False
        frames = [_read_table(path)] if path.exists() else []
        save_results(_merge_all(frames + [_read_table(p) for p in parts]), path)
        for p in parts:
            p.unlink()
        return True
    finally:
        os.close(fd)  # releases the lock


def save_results(df: pd.DataFrame, path: str | Path) -> Path:
    """Write ``df`` to ``path`` as Parquet atomically (temporary file, then one rename), oodeval's
    "results table" marker in its metadata; an existing file is replaced only when it carries that marker."""
    path = Path(path)
    with needs():  # pyarrow is the results extra
        write_parquet_atomic(path, _conform(df), "results table")
    return path


def merge_results(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """``old`` with the rows of ``new`` added; a row of ``new`` replaces an ``old`` row with the same key."""
    if len(new) == 0:
        return _conform(old)
    if len(old) == 0:
        return _conform(new)
    both = pd.concat([_conform(old), _conform(new)], ignore_index=True)
    return both.drop_duplicates(subset=list(KEY), keep="last").reset_index(drop=True)


def _merge_all(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Conformed frames stacked in order; a later row replaces an earlier one with the same key."""
    frames = [f for f in frames if len(f)]
    if not frames:
        return empty_results()
    both = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    return both.drop_duplicates(subset=list(KEY), keep="last").reset_index(drop=True)


def done_keys(df: pd.DataFrame, include_errors: bool = False) -> set[tuple]:
    """Keys of the cells already computed (status ``ok``; failed ones too if ``include_errors``)."""
    if len(df) == 0:
        return set()
    rows = df if include_errors else df[df["status"] == "ok"]
    return {_key_of(r) for r in rows[list(KEY)].itertuples(index=False, name=None)}


def _key_of(values: tuple) -> CellKey:
    return CellKey(*(int(v) if k == "seed" else str(v) for k, v in zip(KEY, values)))


def load_cell_scores(row: pd.Series | dict, results_path: str | Path, mmap: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The (ID scores, OOD scores) of one ok row, read from the files beside ``results_path``;
    a missing, truncated or foreign score file is a ValueError naming it."""
    base = Path(results_path).parent
    if row.get("status") != "ok" or pd.isna(row.get("scores_id")) or pd.isna(row.get("scores_ood")):
        raise InputError(f"row {row.get('detector')}/{row.get('dataset')} has no stored scores")
    return _score_file(base / row["scores_id"], mmap), _score_file(base / row["scores_ood"], mmap)


def _score_file(path: Path, mmap: bool) -> np.ndarray:
    try:
        arr = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except FileNotFoundError as exc:
        raise InputError(f"score file {path} is missing") from exc
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"score file {path} is truncated or not a .npy array ({exc})") from exc
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.floating):
        raise InputError(f"score file {path} holds a {arr.dtype} array of shape {arr.shape}, not 1-d float scores")
    return arr


def missing_cell_scores(df: pd.DataFrame, results_path: str | Path) -> list[str]:
    """'FILE: problem' for each score file an ok row names that is missing, truncated or not 1-d
    float scores (header and length checked, the values not read)."""
    problems: dict[str, str] = {}
    rows = df[(df["status"] == "ok") & df["scores_id"].notna() & df["scores_ood"].notna()]
    base = Path(results_path).parent
    for name in pd.unique(pd.concat([rows["scores_id"], rows["scores_ood"]])):
        try:
            _score_file(base / name, mmap=True)
        except ValueError as exc:
            problems[str(name)] = str(exc)
    return list(problems.values())
