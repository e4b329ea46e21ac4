"""Run an experiment grid into its results table, computing only the missing cells.

For every model run (a model with one weights file; per-seed weights make one run per seed):
FeatureSets come from the store (``oodeval.features.extract``, cached) or from precomputed folders;
each detector configuration is built by ``oodeval.scorer_factory.build_scorer`` (the seam of ``oodeval
score`` and ``cnc evaluate`` too: backbone defaults, fitting rows, seed and view, as the detector's
class declares them) and goes through ``oodeval.evaluation.fit_score_evaluate``: fitted ONCE on its
fitting rows (once per seed only for seeded detectors when ``seed_detectors = true``), ID-test and
every OOD set scored once, each
(dataset, split, seed) cell evaluated with ``oodeval.evaluation.cell_metrics`` (percentile 95% CIs
seeded by the cell's seed). The cells of each detector fit are
added to the table as one results part (``oodeval.results.write_part``; also when interrupted),
and the parts are folded into the main file once at the end, so the table is never rewritten
per cell and a killed process loses at most the detector in flight; a failing cell is recorded
with its error and the grid goes on. ``executor="local"`` / ``"slurm"`` runs the same work as
submitit jobs, ``executor="ray"`` as Ray tasks (``oodeval.experiment.executors``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from .. import detectors
from .._device import resolve_device
from .._io import hash_json, save_npy_atomic
from ..data import resolve
from ..detectors.defaults import backbone_family
from ..errors import InputError
from ..features import FeatureSet
from ..features.views import id_view
from ..metrics import accuracy
from ..results import (
    ALL_SPLIT,
    KEY,
    CellKey,
    compact_results,
    _key_of,
    hp_json,
    load_results,
    result_row,
    write_part,
)
from ..scorer_factory import RunSets, Scorer, build_scorer
from ..evaluation import fit_score_evaluate
from .config import DetectorSpec, ExperimentConfig, ExperimentDataset, ModelSpec
from .validation import choose_on_validation
from .zeroshot import (
    build_context,
    default_zeroshot_specs,
    patch_readouts,
    reset_text,
    run_sweeps,
    vocabulary_label,
    vocabulary_source,
    zeroshot_logits,
)

__all__ = ["RunSummary", "Unit", "scores_dir", "unit_cells", "EXECUTORS"]

log = logging.getLogger(__name__)

#: where the grid's work runs: in this process (default), or as submitit jobs
EXECUTORS = ("inprocess", "local", "slurm", "ray")


class Unit(NamedTuple):
    """A unit of work: one model run (model label, weights or "") and one detector configuration
    (its name and hyperparameter key), or every detector of the run (both None: a model whose
    detectors are only known from its features)."""

    model: str
    weights: str
    detector: str | None = None
    hyperparameters: str | None = None

    def covers(self, run: _Run, spec: DetectorSpec | None) -> bool:
        """Whether this unit is (or includes) ``spec`` of ``run`` (``spec`` None: any of its detectors)."""
        return (self.model, self.weights) == (run.model.label, run.weights or "") and (
            self.detector is None or spec is None or (self.detector, self.hyperparameters) == (spec.name, spec.result_key))


@dataclass
class RunSummary:
    """What one call of :func:`run_experiment` did; usable as the path of the results table."""

    results: Path
    total: int = 0
    skipped: int = 0
    computed: int = 0
    failed: int = 0
    fits: int = 0
    failed_kept: int = 0
    #: zero-shot vocabulary sweeps that failed (each also in ``errors``)
    sweeps_failed: int = 0
    #: cells left uncomputed by jobs that did not finish (whole OOD sets, and the split cells known from
    #: other detectors' rows); a rerun computes them
    not_computed: int = 0
    #: model runs with unlisted detectors whose job did not finish (their cell count is unknown)
    runs_not_computed: int = 0
    errors: list[str] = field(default_factory=list)
    #: each distinct error message -> (number of cells, the first such cell)
    error_counts: dict[str, tuple[int, str]] = field(default_factory=dict)
    #: jobs of a distributed run that did not finish ("job WHAT (ID): why")
    lost: list[str] = field(default_factory=list)

    def __fspath__(self) -> str:
        """A summary stands for its results table: ``pd.read_parquet(run_experiment(...))`` works."""
        return str(self.results)

    def __str__(self) -> str:
        missing = f", {self.not_computed} not computed" if self.not_computed else ""
        return (
            f"{self.total} cells: {self.skipped} already done, {self.computed} computed "
            f"({self.failed} failed){missing}, {self.fits} detector fits -> {self.results}"
        )

    @property
    def ok(self) -> bool:
        """True when nothing failed: no cell, sweep or job in this call, none kept from before (``retry_failed = false``)."""
        return not self.errors and not self.lost and self.failed_kept == 0

    def add_error(self, cell: str, message: str, *, sweep: bool = False) -> None:
        """Record a failed cell (or, with ``sweep``, a failed vocabulary sweep) and its message."""
        self.sweeps_failed += sweep
        self.errors.append(f"{cell}: {message}")
        n, first = self.error_counts.get(message, (0, cell))
        self.error_counts[message] = (n + 1, first)


def scores_dir(results: Path) -> Path:
    """The folder beside the results table that holds the per-cell score arrays."""
    return results.parent / f"{results.stem}.scores"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _error_text(exc: BaseException) -> str:
    msg = f"{type(exc).__name__}: {exc}"
    return msg if len(msg) < 2000 else msg[:2000] + " ..."


# ---------------------------------------------------------------------------- features
FeatureFn = Callable[[ModelSpec, "str | None", ExperimentDataset, str, ExperimentConfig], FeatureSet]


def _extract_options(model: ModelSpec, weights: str | None, cfg: ExperimentConfig) -> dict:
    return {"weights": weights, "pretrained": bool(model.pretrained), "data_root": cfg.data_root, "batch_size": cfg.batch_size, "num_workers": cfg.num_workers,
            "device": cfg.device, "model_kwargs": model.model_kwargs or None, "progress": cfg.progress, "head": model.head,
            "full_image_hash": cfg.full_image_hash}


def extract_experiment_features(model: ModelSpec, weights: str | None, ds: ExperimentDataset, role: str, cfg: ExperimentConfig) -> FeatureSet:
    """The FeatureSet of ``ds`` under ``model``: a precomputed folder named in the model's
    ``features`` table (by role ``id_train`` / ``id_test``, OOD label or csID label), else the store.
    NAC taps (``model.taps``) are extracted for the test and OOD sets here; on ID train only
    for the fitting rows of a detector that declares them (:func:`tapped_fit_features`). A zero-shot model with ``patch_features`` gets
    GL-MCM's patch readouts for the ID names at each gl_mcm tau (``zeroshot.patch_readouts``); the full
    patch tensor (float16) only with ``full_patch_features``. A supervised model's precomputed FeatureSet
    that records no model is taken to come from its ``name`` (which picks the backbone defaults)."""
    given = role.removeprefix("csid:")  # a csID set's precomputed folder is named by its label
    if given in model.features:
        fs = FeatureSet.load(model.features[given])
        if model.kind == "supervised":
            fs.meta.setdefault("model", model.name)
        return fs
    return FeatureSet.load(_from_store(model, weights, ds, role, cfg))


def _from_store(model: ModelSpec, weights: str | None, ds: ExperimentDataset, role: str, cfg: ExperimentConfig,
                cached_only: bool = False) -> Path | None:
    """The store entry of ``ds`` under ``model`` (extracted here unless ``cached_only``; then None when it
    is not in the store, or cannot be found without loading a model: GL-MCM's patch readouts need
    the text tower)."""
    from ..features.extract import extract

    taps = bool(model.taps) and role != "id_train"
    readouts = ()
    if model.patch_features and model.kind == "zero-shot":
        if cached_only:
            return None
        readouts = patch_readouts(model, weights, cfg)
    passes = _role_passes(model, weights, role, cfg, cached_only)
    if passes is None:
        return None
    return extract(model.name, ds.name, cfg.store, taps=taps, patch_features=model.full_patch_features or
                   (model.patch_features and model.kind != "zero-shot"), patch_readouts=readouts,
                   passes=passes, cached_only=cached_only, **_extract_options(model, weights, cfg))  # fmt: skip


def _role_passes(model: ModelSpec, weights: str | None, role: str, cfg: ExperimentConfig, cached_only: bool = False) -> list | None:
    """The model's network passes for one role: on ID train only what a fit reads (gram and adascale as
    given, mds clean, i.e. noise 0); elsewhere all, mds with noise > 0 perturbed along the Gaussians of the
    ID-train set's clean mds pass (extracted, or read from the cache, here; with ``cached_only``
    None when that set is not in the store yet)."""
    def clean(spec):
        return replace(spec, settings=tuple((k, 0.0 if k == "noise" else v) for k, v in spec.settings))

    if role == "id_train":
        return [s if s.kind in ("gram", "adascale") else clean(s) for s in model.passes if s.kind in ("gram", "mds", "adascale")]
    out = []
    for spec in model.passes:
        if spec.kind == "mds" and float(spec.get("noise")) > 0:
            if "id_train" in model.features:
                fit = model.features["id_train"]
            elif cfg.id_train is not None:
                from ..features.extract import extract

                found = extract(model.name, cfg.id_train.name, cfg.store, passes=_role_passes(model, weights, "id_train", cfg),
                                cached_only=cached_only, **_extract_options(model, weights, cfg))  # fmt: skip
                if found is None:
                    return None
                fit = str(found)
            else:
                raise InputError("mds with noise > 0 needs the experiment's id_train set (its Gaussians guide the perturbation)")
            spec = replace(spec, settings=tuple((k, fit if k == "fit" else v) for k, v in spec.settings))
        out.append(spec)
    return out


def tapped_fit_features(run: _Run, cfg: ExperimentConfig, n_fit: int | None, seed: int) -> FeatureSet:
    """The tapped class-balanced ID-train rows a detector that declares ``fits_on`` fits on
    (``extract_nac_fit``), extracted once per (size, seed)."""
    key = f"tapped-fit/{n_fit}/{seed}"
    if key not in run.feats:
        from ..features.extract import extract_nac_fit

        path = extract_nac_fit(run.model.name, cfg.id_train.name, cfg.store, n_fit=n_fit, seed=seed,
                               **_extract_options(run.model, run.weights, cfg))  # fmt: skip
        run.feats[key] = FeatureSet.load(path)
    return run.feats[key]


def split_values(fs: FeatureSet, ds: ExperimentDataset, cfg: ExperimentConfig) -> np.ndarray | None:
    """Per-sample values of the dataset's split column (None when it has none).

    Read from the FeatureSet's extra array of that name when present, else from the dataset's
    manifest (``oodeval.data.resolve``), whose rows are in FeatureSet order.
    """
    col = ds.split_column
    if col is None:
        return None
    if col in fs.extras:
        values = np.asarray(fs.extras[col])
    else:
        manifest = resolve(ds.name, cfg.data_root)
        raw = getattr(manifest, col, None)
        if raw is None:
            raise InputError(f"dataset {ds.label!r} has no split column {col!r} (neither a FeatureSet extra nor a manifest column)")
        values = np.asarray(raw)
    if values.shape[0] != len(fs):
        raise InputError(f"split column {col!r} of {ds.label!r} has {values.shape[0]} values for {len(fs)} samples")
    return values


def _split_masks(values: np.ndarray | None, column: str | None) -> dict[str, np.ndarray | None]:
    out: dict[str, np.ndarray | None] = {ALL_SPLIT: None}
    if values is not None:
        text = np.array([str(x) for x in values.tolist()], dtype=object)
        for v in sorted(set(text)):
            out[f"{column}={v}"] = text == v
    return out


# ---------------------------------------------------------------------------- scorers
def _run_sets(run: _Run, cfg: ExperimentConfig) -> RunSets:
    """The FeatureSets a scorer of ``run`` is built from (:func:`oodeval.scorer_factory.build_scorer`): ID
    train and test, and the tapped fitting rows, extracted on demand where the ID-train set holds
    no taps of its own (:func:`_taps_fit_rows`)."""
    train = run.feats.get("id_train")
    tapped = (lambda size, seed: tapped_fit_features(run, cfg, size, seed)) if _taps_fit_rows(run, train) else None
    return RunSets(train, run.feats.get("id_test"), tapped)


def _build(run: _Run, spec: DetectorSpec, cfg: ExperimentConfig, seed: int | None = None, hyperparameters: dict | None = None) -> Scorer:
    """The scorer of ``spec`` (with ``hyperparameters`` instead of its own, for the validation search) in ``run``."""
    hp = spec.hyperparameters if hyperparameters is None else hyperparameters
    return build_scorer(spec.name, hp, _run_sets(run, cfg), seed=seed, kind=run.model.kind, context=run.context,
                        vocabulary=spec.vocabulary, device=_detector_device(cfg))  # fmt: skip


def _detector_device(cfg: ExperimentConfig) -> str | None:
    """The experiment's ``detector_device`` ("auto": its extraction ``device``, resolved as extraction
    resolves it); None without one (the detectors compute with numpy)."""
    if cfg.detector_device is None:
        return None
    return str(resolve_device(cfg.device)) if cfg.detector_device == "auto" else cfg.detector_device


def _id_accuracy(model: ModelSpec, fs: FeatureSet, context: dict) -> float:
    if not (fs.labels >= 0).any():
        return float("nan")
    if model.kind == "supervised":
        fs = id_view(fs)  # a K+1 (CnC) model: argmax over the first K logits
        return accuracy(fs.logits, fs.labels) if fs.logits is not None else float("nan")

    logits = zeroshot_logits(fs, context)
    return float("nan") if logits is None else accuracy(logits, fs.labels)


# ---------------------------------------------------------------------------- the grid
@dataclass
class _Run:
    model: ModelSpec
    weights: str | None
    seeds: list[int]
    feats: dict[str, FeatureSet] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    splits: dict[str, dict[str, np.ndarray | None]] = field(default_factory=dict)
    specs: list[DetectorSpec] = field(default_factory=list)
    context: dict = field(default_factory=dict)
    id_accuracy: float | None = None  # computed once per run, on first use
    inputs: dict[str, str | None] = field(default_factory=dict)  # per OOD label: what its cells are computed from


def _specs_for(run: _Run, cfg: ExperimentConfig) -> list[DetectorSpec]:
    given = cfg.detectors_for(run.model)
    if given is not None:
        return list(given)
    if run.model.kind == "supervised":
        test = run.feats.get("id_test")
        if test is None:
            return []
        names = detectors.supported(run.feats.get("id_train"), test)
        if _taps_fit_rows(run, run.feats.get("id_train")):  # a detector that fits on its own tapped rows
            own = [n for n in detectors.default_names() if detectors.REGISTRY[n].fits_on is not None and detectors.supported(test, test, [n])]
            names = [n for n in detectors.names() if n in names or n in own]
        return [DetectorSpec(n) for n in names]

    return default_zeroshot_specs()


def _cell_key(run: _Run, spec: DetectorSpec, dataset: str, split: str, seed: int) -> CellKey:
    return CellKey(run.model.label, run.weights or "", spec.name, spec.result_key, dataset, split, int(seed))


def _feature_roles(model: ModelSpec, cfg: ExperimentConfig) -> list[tuple[str, ExperimentDataset]]:
    """(role, dataset) of the FeatureSets a model's cells are computed from: ID train (supervised), ID
    test, each OOD set, each covariate-shifted ID set (role ``csid:<label>``, full-spectrum OOD). A deep
    ensemble fits on nothing: no ID train (its members' would be combined for nothing)."""
    roles: list[tuple[str, ExperimentDataset]] = [("id_test", cfg.id_test)]
    if model.kind == "supervised" and not model.ensemble and (cfg.id_train is not None or "id_train" in model.features):
        roles.insert(0, ("id_train", cfg.id_train or ExperimentDataset("id_train", "id_train")))
    return roles + [(d.label, d) for d in cfg.ood] + [(f"csid:{d.label}", d) for d in cfg.csid]


def _cell_inputs(cfg: ExperimentConfig, model: ModelSpec, hashes: dict[str, str | None]) -> dict[str, str | None]:
    """Per OOD label, the fingerprint of everything its cells are computed from: the content hashes
    of the ID train, ID test and OOD FeatureSets and the bootstrap settings (None: a hash unknown).
    A recorded cell is reused only while its fingerprint is the current one."""
    id_roles = [r for r, _ in _feature_roles(model, cfg) if r in ("id_train", "id_test") or r.startswith("csid:")]
    out: dict[str, str | None] = {}
    for ds in cfg.ood:
        parts = {r: hashes.get(r) for r in (*id_roles, ds.label)}
        out[ds.label] = None if None in parts.values() else hash_json(
            {"features": [parts[r] for r in (*id_roles, ds.label)], "bootstrap_draws": cfg.bootstrap_draws,
             "bootstrap_fixed_id": cfg.bootstrap_fixed_id})  # fmt: skip
    return out


def _recorded_hash(model: ModelSpec, weights: str | None, role: str, ds: ExperimentDataset, cfg: ExperimentConfig) -> str | None:
    """A FeatureSet's content hash known without loading its arrays: the one its meta.json records
    (checked against the arrays when it is loaded), of a precomputed folder or of the finished store
    entry the run's extraction would read (found by its key, :func:`_from_store` with
    ``cached_only``); None when there is none yet. A csID set's precomputed folder is named by its label."""
    given = role.removeprefix("csid:")
    if model.ensemble:  # known once its members' FeatureSets are loaded
        return None
    try:
        folder = Path(model.features[given]) if given in model.features else _from_store(model, weights, ds, role, cfg, cached_only=True)
        if folder is None:
            return None
        return str(json.loads((folder / "meta.json").read_text())["content_hash"])
    except Exception:  # noqa: BLE001 - unknown here: the run loads (or extracts) it and reports any problem
        log.debug("no recorded hash for %s/%s", model.label, role, exc_info=True)
        return None


def _plan_run(run: _Run, cfg: ExperimentConfig, features: FeatureFn) -> None:
    if run.model.ensemble:
        features = ensemble_features(features)
    reset_text()  # label embeddings are computed anew for each run (from the text cache), shared within it
    roles = _feature_roles(run.model, cfg)
    if cfg.selection is not None and any(s.search for s in cfg.detectors_for(run.model) or ()):
        roles += [("validation_id", cfg.selection.validation_id), ("validation_ood", cfg.selection.validation_ood)]
    for role, ds in roles:
        try:
            run.feats[role] = features(run.model, run.weights, ds, role, cfg)
            if role not in ("id_train", "id_test") and not role.startswith("csid:"):
                run.splits[role] = _split_masks(split_values(run.feats[role], ds, cfg), ds.split_column)
        except Exception as exc:  # noqa: BLE001 - recorded, the grid goes on
            log.debug("features of %s failed", role, exc_info=True)
            run.errors[role] = f"features of {ds.label!r} failed: {_error_text(exc)}"
            run.splits.setdefault(role, {ALL_SPLIT: None})
    if run.model.kind == "zero-shot" and "id_test" in run.feats:
        try:
            run.context = build_context(run.model, run.weights, cfg, run.feats)
        except Exception as exc:  # noqa: BLE001
            run.errors["id_test"] = f"zero-shot text side failed: {_error_text(exc)}"
    run.inputs = _cell_inputs(cfg, run.model, {role: str(fs.meta.get("content_hash") or fs.content_hash()) for role, fs in run.feats.items()})
    try:
        run.specs = _specs_for(run, cfg)
    except Exception as exc:  # noqa: BLE001 - recorded as one failed cell per OOD set
        run.errors.setdefault("id_test", f"choosing the detectors failed: {_error_text(exc)}")
        run.specs = []
    if not run.specs:
        run.specs = [DetectorSpec("*")]


def _split_cells(done: set[CellKey]) -> dict[tuple, int]:
    """Number of done split cells (split != all) per key without its split."""
    out: dict[tuple, int] = {}
    for key in done:
        if key.split != ALL_SPLIT:
            k = key.without_split()
            out[k] = out.get(k, 0) + 1
    return out


def _settled(
    run: _Run, cfg: ExperimentConfig, done: dict[CellKey, str | None], split_done: dict[tuple, int], specs: list | None = None
) -> int | None:
    """The number of cells of a run (of its ``specs``, default all) when every one of them is
    already done from the current inputs (known without its features: an explicit detector list,
    precomputed FeatureSets whose recorded content hashes match, split cells already in the table),
    else None."""
    specs = cfg.detectors_for(run.model) if specs is None else specs
    if specs is None or (cfg.sweeps and run.model.kind == "zero-shot"):
        return None
    n = 0
    for spec in specs:
        for ds in cfg.ood:
            for seed in run.seeds:
                key = _cell_key(run, spec, ds.label, ALL_SPLIT, seed)
                if key not in done or run.inputs.get(ds.label) is None or done[key] != run.inputs[ds.label]:
                    return None
                n += 1
                if ds.split_column is not None:
                    parts = split_done.get(key.without_split(), 0)
                    if parts == 0:
                        return None
                    n += parts
    return n


def _current(table: pd.DataFrame) -> pd.DataFrame:
    """The rows that count as done: a post-hoc cell recorded without its resolved hyperparameters
    predates per-backbone defaults (it may have run with other values), so it is computed again."""
    stale = (table["status"] == "ok") & (table["kind"] == "supervised") & table["hyperparameters_resolved"].isna()
    return table[~stale.fillna(False).astype(bool)]


def _row(key: CellKey, cell: dict, scorer: Scorer | None = None, **values) -> dict:
    """A results row of the grid (:func:`oodeval.results.result_row`), stamped with its creation time."""
    return result_row(cell, scorer, key, resolved=scorer is not None, **values, created=_now())


def _done(table: pd.DataFrame, cfg: ExperimentConfig) -> dict[CellKey, str | None]:
    """{key: recorded inputs fingerprint} of the cells that count as done (failed ones too unless
    ``retry_failed``). An ok cell recorded without a fingerprint (by an older oodeval) is not done."""
    rows = _current(table)
    if len(rows) == 0:
        return {}
    keep = (rows["status"] == "ok") & rows["inputs"].notna()
    if not cfg.retry_failed:
        keep |= rows["status"] != "ok"
    return {_key_of(tuple(r[:-1])): (None if pd.isna(r[-1]) else str(r[-1]))
            for r in rows[keep][[*KEY, "inputs"]].itertuples(index=False, name=None)}


def _model_runs(cfg: ExperimentConfig, done: dict[CellKey, str | None], split_done: dict[tuple, int]) -> tuple[list[_Run], int]:
    """The model runs (a model with one weights file and its seeds) with cells left to compute,
    and the number of cells of the settled ones."""
    runs, settled = [], 0
    for model in cfg.models:
        groups: dict[str | None, list[int]] = {}
        for i, seed in enumerate(cfg.seeds):
            groups.setdefault(model.weights_for(i), []).append(seed)
        recorded = any(key.model == model.label for key in done)  # else nothing to look up: every cell is pending
        for weights, seeds in groups.items():
            hashes = {role: _recorded_hash(model, weights, role, ds, cfg) if recorded else None for role, ds in _feature_roles(model, cfg)}
            run = _Run(model, weights, seeds, inputs=_cell_inputs(cfg, model, hashes))
            n = _settled(run, cfg, done, split_done)
            if n is None:
                runs.append(run)
            else:  # every cell done: no features needed, nothing re-extracted or re-hashed
                settled += n
    return runs, settled


def unit_cells(cfg: ExperimentConfig, unit: Unit) -> list[CellKey] | None:
    """The cells of ``unit`` over whole OOD sets (None: its detectors are not listed, so unknown
    without its features)."""
    if unit.detector is None:
        return None
    model = next(m for m in cfg.models if m.label == unit.model)
    seeds = [seed for i, seed in enumerate(cfg.seeds) if (model.weights_for(i) or "") == unit.weights]
    return [CellKey(unit.model, unit.weights, unit.detector, unit.hyperparameters, ds.label, ALL_SPLIT, int(seed))
            for ds in cfg.ood for seed in seeds]  # fmt: skip


def pending_units(cfg: ExperimentConfig) -> tuple[list[Unit], int]:
    """The units of work with cells left (one per (model run, detector) where the experiment
    lists the detectors, else one per model run), known without loading any features, and the
    number of cells already done outside them."""
    table = load_results(cfg.results)
    done = _done(table, cfg)
    split_done = _split_cells(set(done))
    runs, settled = _model_runs(cfg, done, split_done)
    units: list[Unit] = []
    for run in runs:
        specs = cfg.detectors_for(run.model)
        if specs is None or (cfg.sweeps and run.model.kind == "zero-shot"):
            units.append(Unit(run.model.label, run.weights or ""))
            continue
        for spec in specs:
            n = _settled(run, cfg, done, split_done, [spec])
            if n is None:
                units.append(Unit(run.model.label, run.weights or "", spec.name, spec.result_key))
            else:
                settled += n
    return units, settled


def run_units(
    cfg: ExperimentConfig,
    features: FeatureFn,
    units: list[Unit] | None = None,
    *,
    progress: bool = True,
    compact: bool = True,
    sweeps: bool = True,
) -> RunSummary:
    """Compute the missing cells of ``units`` (default: the whole grid) in this process.

    Each detector's rows go to the table as one results part; with ``compact`` the parts are
    folded into the main file at the end (a job of a distributed run leaves that to its
    coordinator). ``sweeps``: also run the zero-shot vocabulary sweeps of the experiment.
    """
    from tqdm.auto import tqdm

    table = load_results(cfg.results)
    done = _done(table, cfg)
    summary = RunSummary(results=cfg.results)
    split_done = _split_cells(set(done))
    runs, settled_cells = _model_runs(cfg, done, split_done)

    def is_done(run: _Run, cell: CellKey) -> bool:
        return cell in done and done[cell] == run.inputs.get(cell.dataset)

    def wanted(run: _Run, spec: DetectorSpec | None) -> bool:
        return units is None or any(unit.covers(run, spec) for unit in units)

    runs = [r for r in runs if wanted(r, None) or (sweeps and cfg.sweeps and r.model.kind == "zero-shot")]
    for run in runs:
        _plan_run(run, cfg, features)
    plans = []
    for run in runs:
        for spec in run.specs:
            if not wanted(run, spec):
                continue
            cells = [
                _cell_key(run, spec, ds.label, split, seed)
                for ds in cfg.ood
                for split in run.splits[ds.label]
                for seed in run.seeds
            ]
            plans.append((run, spec, cells))
    summary.total = (settled_cells if units is None else 0) + sum(len(c) for _, _, c in plans)
    todo = sum(1 for run, _, cells in plans for c in cells if not is_done(run, c))
    summary.skipped = summary.total - todo
    summary.failed_kept = _failed_kept(table, cfg) if not cfg.retry_failed else 0
    bar = tqdm(total=summary.total, initial=summary.skipped, unit="cell", desc=f"{cfg.name} cells", disable=not progress)
    pending: list[dict] = []

    def record(row: dict) -> None:
        pending.append(row)
        summary.computed += 1
        if row["status"] != "ok":
            summary.failed += 1
            summary.add_error(f"{row['model']}/{row['detector']}/{row['dataset']}/{row['split']}/seed {row['seed']}", row["error"])
        bar.update(1)

    def flush() -> None:
        write_part(pd.DataFrame(pending), cfg.results)
        pending.clear()

    try:
        for run, spec, cells in plans:
            todo_cells = [c for c in cells if not is_done(run, c)]
            if todo_cells:
                bar.set_postfix_str(f"{run.model.label} / {spec.display}")
                _run_detector(run, spec, todo_cells, cfg, lambda row, run=run: record(dict(row, inputs=run.inputs.get(row["dataset"]))), summary)
                flush()
    finally:
        bar.close()
        flush()
        if compact:
            compact_results(cfg.results)
    if sweeps and cfg.sweeps:
        for run in runs:
            if run.model.kind == "zero-shot":
                run_sweeps(run.model, run.feats, run.context, run.errors, cfg, summary)
    return summary


def _failed_kept(table: pd.DataFrame, cfg: ExperimentConfig) -> int:
    """Failed cells of this grid's models and OOD sets that the table keeps (``retry_failed = false``)."""
    if len(table) == 0:
        return 0
    mine = table["model"].isin([m.label for m in cfg.models]) & table["dataset"].isin([d.label for d in cfg.ood])
    return int((mine & (table["status"] == "error") & table["seed"].isin(cfg.seeds)).sum())


def _base_info(run: _Run, spec: DetectorSpec, cfg: ExperimentConfig) -> dict:
    source = run.feats.get("id_train", run.feats.get("id_test"))
    return {
        "kind": run.model.kind,
        "backbone": backbone_family(source.meta.get("model") if source is not None else run.model.name),
        "label": spec.display,
        "vocabulary": vocabulary_label(spec.vocabulary),
        "vocabulary_source": vocabulary_source(spec.vocabulary),
        "id_train": cfg.id_train.label if cfg.id_train else None,
        "id_test": cfg.id_test.label,
        "bootstrap_draws": cfg.bootstrap_draws,
        "bootstrap_fixed_id": cfg.bootstrap_fixed_id,
        "random_init": run.model.random_init or (source is not None and source.meta.get("random_init") is True),
    }


def _run_detector(run: _Run, spec: DetectorSpec, cells: list[CellKey], cfg: ExperimentConfig, record, summary: RunSummary) -> None:
    """Fit once per distinct (seeded) hyperparameter set, score once per dataset, evaluate every cell."""
    info = _base_info(run, spec, cfg)
    if spec.search and not run.errors.get("id_test"):
        t0 = time.perf_counter()
        try:
            spec, info["selection"] = choose_on_validation(run, spec, cfg, lambda hp: _build(run, spec, cfg, hyperparameters=hp))
        except Exception as exc:  # noqa: BLE001 - recorded, the grid goes on
            for key in cells:
                record(_row(key, _failed(f"validation search failed: {_error_text(exc)}"), seconds=time.perf_counter() - t0, **info))
            return

    def fail(cell_list: list[CellKey], message: str, t0: float, scorer: Scorer | None = None) -> None:
        for key in cell_list:
            record(_row(key, _failed(message), scorer, seconds=time.perf_counter() - t0, **info))

    blocking = run.errors.get("id_test") or ("no detector applies to these features" if spec.name == "*" else None)
    if blocking:
        fail(cells, blocking, time.perf_counter())
        return
    by_hp: dict[str, tuple[Scorer | None, list[CellKey]]] = {}
    built: dict[int | None, Scorer | BaseException] = {}
    t0 = time.perf_counter()
    for key in cells:
        seed = key.seed if cfg.seed_detectors else None
        if seed not in built:
            try:
                built[seed] = _build(run, spec, cfg, seed)
            except Exception as exc:  # noqa: BLE001 - recorded, the grid goes on
                log.debug("detector %s failed", spec.name, exc_info=True)
                built[seed] = exc
        scorer = built[seed]
        group = hp_json(scorer.hyperparameters) if isinstance(scorer, Scorer) else f"failed: {seed}"
        by_hp.setdefault(group, (scorer, []))[1].append(key)

    for hpj, (scorer, hp_cells) in by_hp.items():
        if isinstance(scorer, BaseException):
            fail(hp_cells, _error_text(scorer), t0)
            continue
        t0 = time.perf_counter()
        try:
            if scorer.fit_needs and scorer.train is None:
                raise RuntimeError(run.errors.get("id_train", "no ID-train features to fit on"))
            if run.id_accuracy is None:
                run.id_accuracy = _id_accuracy(run.model, run.feats["id_test"], run.context)
        except Exception as exc:  # noqa: BLE001 - recorded, the grid goes on
            log.debug("detector %s failed", spec.name, exc_info=True)
            fail(hp_cells, _error_text(exc), t0, scorer)
            continue
        by_set: dict[str, list] = {}
        for key in hp_cells:
            by_set.setdefault(key.dataset, []).append((key.split, key.seed, run.splits[key.dataset][key.split]))
        oods = {label: RuntimeError(run.errors[label]) if label in run.errors else run.feats[label] for label in by_set}
        keys = {(key.dataset, key.split, key.seed): key for key in hp_cells}
        scores: dict = {}
        fitted = False
        folder = scores_dir(cfg.results) / hash_json([run.model.label, run.weights or "", spec.name, spec.result_key, hpj])
        csid = {d.label: RuntimeError(run.errors[f"csid:{d.label}"]) if f"csid:{d.label}" in run.errors else run.feats[f"csid:{d.label}"]
                for d in cfg.csid}  # fmt: skip
        for row in fit_score_evaluate(scorer, scorer.train, run.feats["id_test"], oods, cells=by_set, draws=cfg.bootstrap_draws,
                                      fixed_id=cfg.bootstrap_fixed_id, scores_out=scores, csid=csid):  # fmt: skip
            if "id" in scores and not fitted:
                fitted, summary.fits = True, summary.fits + 1
                save_npy_atomic(folder / "id.npy", np.asarray(scores["id"], dtype=np.float64))
            label, split, seed = row["ood"], row["split"], row["seed"]
            if row["status"] == "ok" and "stream" in row:  # a test-time scorer: its scores are per stream
                row.update(id_accuracy=run.id_accuracy, seconds=row["score_seconds"])
            elif row["status"] == "ok":
                mask = run.splits[label][split]
                ood_file = folder / f"{hash_json([label, split])}.npy"
                save_npy_atomic(ood_file, np.asarray(scores[label] if mask is None else scores[label][mask], dtype=np.float64))
                row.update(id_accuracy=run.id_accuracy, scores_id=str((folder / "id.npy").relative_to(cfg.results.parent)),
                           scores_ood=str(ood_file.relative_to(cfg.results.parent)),
                           seconds=row["fit_seconds"] / len(hp_cells) + row["score_seconds"])  # fmt: skip
            record(_row(keys[(label, split, seed)], row, scorer, **info))


def _failed(message: str) -> dict:
    return {"status": "error", "error": message}


def _taps_fit_rows(run: _Run, train: FeatureSet | None) -> bool:
    """Whether a detector's own fitting rows (``fits_on``) must be extracted with taps: an extracted
    (not precomputed) ID train set of a model with taps, which therefore holds no tapped states of its own."""
    return (run.model.kind == "supervised" and bool(run.model.taps) and train is not None
            and "id_train" not in run.model.features and not train.extras_with_prefix("nac/"))  # fmt: skip


def ensemble_features(features: FeatureFn) -> FeatureFn:
    """The FeatureFn of a deep ensemble's model (``ensemble = [...]``): each member's FeatureSet of the
    dataset from ``features`` (the store, or a precomputed folder), once per weights file of the
    member (one per seed where it has several), made one by
    :func:`oodeval.features.ensemble.ensemble_featureset` (members named by label, and seed where
    a member has several weights files)."""
    from ..features.ensemble import ensemble_featureset

    def build(model: ModelSpec, weights: str | None, ds: ExperimentDataset, role: str, cfg: ExperimentConfig) -> FeatureSet:
        sets, names = [], []
        for label in model.ensemble:
            member = next(m for m in cfg.models if m.label == label)
            runs: dict[str | None, int] = {}
            for i, seed in enumerate(cfg.seeds):
                runs.setdefault(member.weights_for(i), seed)
            for w, seed in runs.items():
                sets.append(features(member, w, ds, role, cfg))
                names.append(label if len(runs) == 1 else f"{label} seed {seed}")
        return ensemble_featureset(sets, names)

    return build
