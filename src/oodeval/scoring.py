"""Fit-then-score every requested detector on cached features and tabulate FPR@95 and AUROC.

The reusable loop behind ``oodeval score`` (and the experiment grid): one fit per detector on
the ID-train FeatureSet, one score pass over the ID-test set and each OOD set, metrics from
:func:`oodeval.metrics.evaluate` (fractions; ID positive, higher score = ID).
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Mapping

from .features import FeatureSet

__all__ = ["evaluate_detectors", "parse_hyperparameters", "format_table"]


def parse_hyperparameters(items: list[str]) -> dict[str, dict[str, object]]:
    """``["knn.k=50", "energy.t=2"]`` -> ``{"knn": {"k": 50}, "energy": {"t": 2.0}}``.

    Values are parsed as JSON when possible (numbers, true/false, null, lists), else kept as text.
    """
    out: dict[str, dict[str, object]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        name, dot, param = key.partition(".")
        if not (sep and dot and name and param):
            raise ValueError(f"hyperparameter {item!r} is not of the form DETECTOR.NAME=VALUE")
        try:
            parsed: object = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        out.setdefault(name.strip(), {})[param.strip()] = parsed
    return out


def evaluate_detectors(
    train: FeatureSet,
    test: FeatureSet,
    oods: Mapping[str, FeatureSet],
    names: list[str] | None = None,
    hyperparameters: Mapping[str, Mapping[str, object]] | None = None,
    scores_out: dict | None = None,
    progress: bool = True,
) -> list[dict]:
    """One row per (detector, OOD set): detector, ood, n_id, n_ood, fpr95, tnr95, auroc,
    aupr_in, aupr_out, detection_error (fractions) and fit/score seconds.

    ``names`` defaults to every detector the FeatureSets support (:func:`detectors.supported`,
    checked against the test and every OOD set); in that default mode a detector whose fit is
    impossible on this data (e.g. knn's k above the bank size) is skipped with a warning naming
    the reason. An explicitly named detector that fails raises ValueError naming what is missing.
    ``hyperparameters`` maps a detector name to constructor overrides. When ``scores_out`` is a
    dict it receives ``scores_out[detector] = {"id": ..., ood_name: ...}``.
    """
    from . import detectors
    from .metrics import evaluate

    if not oods:
        raise ValueError("evaluate_detectors needs at least one OOD FeatureSet")
    hyperparameters = dict(hyperparameters or {})
    skip_failures = names is None
    if names is None:
        names = detectors.supported(train, test)
        for o in oods.values():
            names = detectors.supported(train, o, names)
    unknown = sorted(set(names) - set(detectors.names()))
    unknown += sorted(set(hyperparameters) - set(detectors.names()))
    if unknown:
        raise ValueError(f"unknown detectors {unknown}; known: {', '.join(detectors.names())}")
    rows: list[dict] = []
    bar = _progress(names, progress)
    for name in bar:
        det = detectors.create(name, **hyperparameters.get(name, {}))
        t0 = time.perf_counter()
        try:
            det.fit(train)
            fit_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            id_scores = det.score(test)
            ood_scores = {k: det.score(v) for k, v in oods.items()}
        except (ValueError, RuntimeError) as err:
            if skip_failures:
                warnings.warn(f"skipped detector {name}: {err}", stacklevel=2)
                continue
            raise ValueError(f"detector {name}: {err}") from err
        score_s = time.perf_counter() - t0
        if scores_out is not None:
            scores_out[name] = {"id": id_scores, **ood_scores}
        for ood_name, s in ood_scores.items():
            row = {"detector": name, "ood": ood_name, "n_id": int(id_scores.size), "n_ood": int(s.size)}
            row.update({k: float(v) for k, v in evaluate(id_scores, s).items()})
            row.update(fit_seconds=round(fit_s, 4), score_seconds=round(score_s, 4))
            rows.append(row)
    return rows


def _progress(names: list[str], enabled: bool):
    if not enabled:
        return names
    from tqdm import tqdm

    return tqdm(names, desc="detectors", unit="det", leave=False)


def format_table(rows: list[dict]) -> str:
    """Text table: one line per detector, FPR@95 / AUROC (%) per OOD set."""
    oods = list(dict.fromkeys(r["ood"] for r in rows))
    dets = list(dict.fromkeys(r["detector"] for r in rows))
    cell = {(r["detector"], r["ood"]): r for r in rows}
    width = max([len("detector")] + [len(d) for d in dets])
    head = f"{'detector':<{width}}" + "".join(f"  {o[:22]:>22}" for o in oods)
    sub = f"{'':<{width}}" + "".join(f"  {'FPR@95 / AUROC (%)':>22}" for _ in oods)
    lines = [head, sub]
    for d in dets:
        vals = []
        for o in oods:
            r = cell.get((d, o))
            vals.append(f"  {100 * r['fpr95']:>10.2f} / {100 * r['auroc']:>6.2f}" if r else f"  {'-':>22}")
        lines.append(f"{d:<{width}}" + "".join(f"{v:>24}" for v in vals))
    return "\n".join(lines)



def cell_metrics(id_scores, ood_scores, seed: int = 0, draws: int = 1000, fixed_id: bool = True) -> dict:
    """Every metric of one (ID, OOD) pair (fractions) with percentile 95% bootstrap bounds
    ``<metric>_lo`` / ``<metric>_hi`` for fpr95, tnr95, auroc, detection_error
    (:func:`oodeval.stats.bootstrap`: OOD resampled with the ID set fixed, the paper's App. C
    protocol, or both sets resampled when ``fixed_id`` is False)."""
    import numpy as np

    from .metrics import evaluate
    from .results import BOOTSTRAPPED
    from .stats import bootstrap, confidence_interval

    id_scores, ood_scores = np.asarray(id_scores), np.asarray(ood_scores)
    out: dict = {k: float(v) for k, v in evaluate(id_scores, ood_scores).items()}
    boot = bootstrap(id_scores, ood_scores, draws=draws, seed=seed, fixed_id=fixed_id)
    for m in BOOTSTRAPPED:
        lo, hi = confidence_interval(boot[m][0])
        out[f"{m}_lo"], out[f"{m}_hi"] = float(lo), float(hi)
    out["n_id"], out["n_ood"] = int(id_scores.size), int(ood_scores.size)
    return out


def add_intervals(rows: list[dict], scores: Mapping[str, Mapping[str, object]], draws: int = 1000, seed: int = 0,
                  fixed_id: bool = True) -> list[dict]:
    """``rows`` of :func:`evaluate_detectors` with the bootstrap bounds of :func:`cell_metrics` added
    (``scores`` is its ``scores_out``); ``draws=0`` returns the rows unchanged."""
    if draws == 0:
        return rows
    out = []
    for r in rows:
        s = scores[r["detector"]]
        cell = cell_metrics(s["id"], s[r["ood"]], seed=seed, draws=draws, fixed_id=fixed_id)
        out.append({**r, **{k: v for k, v in cell.items() if k.endswith(("_lo", "_hi"))},
                    "ci_resamples": "OOD (ID fixed)" if fixed_id else "ID and OOD"})
    return out
