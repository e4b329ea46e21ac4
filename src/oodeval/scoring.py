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
    fit_sets: Mapping[str, FeatureSet] | None = None,
) -> list[dict]:
    """One row per (detector, OOD set): detector, ood, n_id, n_ood, fpr95, tnr95, auroc,
    aupr_in, aupr_out, detection_error (fractions), fit/score seconds, the backbone family and
    the detector's full resolved hyperparameters (JSON).

    ``names`` defaults to every detector the FeatureSets support (:func:`detectors.supported`,
    checked against the test and every OOD set); in that default mode a detector whose fit is
    impossible on this data (e.g. knn's k above the bank size) is skipped with a warning naming
    the reason. An explicitly named detector that fails raises ValueError naming what is missing.
    ``hyperparameters`` maps a detector name to constructor overrides; every other
    hyperparameter that depends on the backbone recorded in ``train`` (or ``test`` when there is
    no train set) takes that backbone's release default (:func:`detectors.defaults.resolve_defaults`).
    When ``scores_out`` is a dict it receives ``scores_out[detector] = {"id": ..., ood_name: ...}``.
    ``fit_sets`` maps a detector name to the FeatureSet it fits on instead of ``train`` (NAC's
    tapped fitting rows, :func:`oodeval.features.extract.extract_nac_fit`).
    """
    from . import detectors
    from .detectors.defaults import backbone_family, resolve_defaults
    from .metrics import evaluate
    from .results import hp_json

    if not oods:
        raise ValueError("evaluate_detectors needs at least one OOD FeatureSet")
    hyperparameters = dict(hyperparameters or {})
    skip_failures = names is None
    fit_sets = dict(fit_sets or {})
    if names is None:
        names = [n for n in detectors.names() if detectors.supported(fit_sets.get(n, train), test, [n])]
        for o in oods.values():
            names = [n for n in names if detectors.supported(fit_sets.get(n, train), o, [n])]
    unknown = sorted(set(names) - set(detectors.names()))
    unknown += sorted(set(hyperparameters) - set(detectors.names()))
    if unknown:
        raise ValueError(f"unknown detectors {unknown}; known: {', '.join(detectors.names())}")
    rows: list[dict] = []
    source = train if train is not None else test
    family = backbone_family(source.meta.get("model"))
    bar = _progress(names, progress)
    for name in bar:
        fit_on = fit_sets.get(name, train)
        det = detectors.create(name, **resolve_defaults(name, fit_on if fit_on is not None else source, hyperparameters.get(name)))
        t0 = time.perf_counter()
        try:
            det.fit(fit_on)
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
            row.update(fit_seconds=round(fit_s, 4), score_seconds=round(score_s, 4), backbone=family,
                       hyperparameters=hp_json(det.get_params()))
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

