"""The CnC paper's evaluation: per OOD set and mean over sets, mean ± std over runs.

Seed spec (Hebbalaguppe et al. 2022, "Evaluation Metrics"): TNR@TPR95 (primary), AUROC and
detection error per OOD set, "averaged over all OOD benchmark datasets", plus ID accuracy;
CnC results are "averaged on 3 evaluation runs" (the paper says no more, and the release has no
aggregation code). Metrics come from :func:`oodeval.metrics.all_metrics` (ID positive, exact ties;
detection error = min over thresholds of 0.5(1-TPR) + 0.5 FPR); the spread is
:func:`oodeval.stats.mean_std` with ddof = 1 (the sample std over seeds, oodeval's choice; the
tables state it). Only like runs are averaged: :func:`comparable` refuses runs whose config
(seed aside), data, device, precision or epochs reached differ, and :func:`check_finished` an
unfinished run.

Every detector is built by :func:`oodeval.scorer_factory.build_scorer`, as in ``oodeval score`` and the
grid: its backbone defaults and its view come from its class. On a CnC FeatureSet
(``meta["outlier_class"] = K``) a detector that declares it reads the outlier class (the CnC
detector) sees all K+1 logits; every other one sees the K-way classifier (:func:`id_view`, from
:mod:`oodeval.features.views`: logits and head restricted to the first K classes), and ID accuracy
is the argmax over the first K logits.
Values are fractions; :func:`format_cnc_table` prints percentages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .. import detectors
from ..errors import InputError
from ..features import FeatureSet
from ..features.views import id_view
from ..features.views import num_id_classes as _num_id_classes
from ..metrics import accuracy, all_metrics
from ..results import result_row
from ..scorer_factory import RunSets, build_scorer
from ..stats import mean_std

__all__ = [
    "METRICS", "id_view", "outlier_class_readers", "set_metrics", "evaluate_run", "aggregate", "format_cnc_table", "comparable", "check_id_labels",
    "check_finished",
]  # fmt: skip

#: the seed's OOD metrics (fractions), in the seed's order
METRICS = ("tnr95", "auroc", "detection_error")
_LABELS = {"tnr95": "TNR@TPR95", "auroc": "AUROC", "detection_error": "DetErr", "id_accuracy": "ID Acc"}


#: config fields that may differ between the runs of one mean ± std (the seed is what varies)
_RUN_FIELDS = ("seed",)


def comparable(configs: Sequence, names: Sequence[str] | None = None, epochs_done: Sequence[int] | None = None):
    """The first of several :class:`~oodeval.cnc.train.CnCTrainConfig` when all runs share one
    configuration and training data (everything but the seed: the data hash, device and
    precision included) and, when ``epochs_done`` is given, reached the same epoch; otherwise
    ValueError naming the runs and what differs."""
    if not configs:
        raise InputError("no checkpoints")
    names = list(names or [f"run {i + 1}" for i in range(len(configs))])
    if epochs_done is not None and len(set(epochs_done)) > 1:
        i = next(i for i, e in enumerate(epochs_done) if e != epochs_done[0])
        raise InputError(f"{names[i]} reached epoch {epochs_done[i]} and {names[0]} epoch {epochs_done[0]}; "
                         "a mean ± std needs runs trained equally long: evaluate them separately")
    first = configs[0].to_json()
    for name, cfg in zip(names[1:], configs[1:]):
        d = cfg.to_json()
        diff = [k for k in first if k not in _RUN_FIELDS and first[k] != d.get(k)]
        if diff:
            what = "; ".join(f"{k}: {first[k]!r} vs {d.get(k)!r}" for k in diff)
            raise InputError(f"{name} and {names[0]} differ in more than the seed ({what}); "
                             "a mean ± std needs runs of one configuration and one training set: evaluate them separately")
    return configs[0]


def check_finished(config, progress: Mapping, name: str, allow: bool = False) -> bool:
    """True when the run reached ``config.epochs``; an unfinished run is a ValueError naming it
    unless ``allow`` (then False is returned and the caller marks the numbers as unfinished)."""
    done = int(progress.get("epochs_done", 0))
    if done >= config.epochs:
        return True
    if not allow:
        raise InputError(f"{name} is unfinished: {done} of {config.epochs} epochs trained; finish it with "
                         "`oodeval cnc train` (same command) or pass --allow-unfinished to evaluate it marked as such")
    return False


def check_id_labels(labels: np.ndarray, num_classes: int, name: str = "the ID set") -> None:
    """ValueError when ID labels fall outside the model's K classes (the wrong ID set, or --classes missing)."""
    labels = np.asarray(labels)
    known = labels[labels >= 0]
    if known.size == 0:
        raise InputError(f"{name} has no class labels; ID accuracy needs them")
    if known.max() >= num_classes:
        n = int((known >= num_classes).sum())
        raise InputError(f"{name} has {n} images labelled {num_classes}..{int(known.max())} but the model has "
                         f"K = {num_classes} ID classes; use the ID set it was trained on (and its class subset)")


def outlier_class_readers() -> list[str]:
    """The detectors of a default selection that declare they read a K+1 model's outlier class (``reads_outlier_class``)."""
    return [n for n in detectors.default_names() if detectors.REGISTRY[n].reads_outlier_class]


def set_metrics(id_scores: np.ndarray, ood_scores: Mapping[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """{set: {tnr95, auroc, detection_error}} plus ``"mean"``: the unweighted mean over the sets."""
    if not ood_scores:
        raise InputError("no OOD sets to evaluate")
    out = {}
    for name, scores in ood_scores.items():
        m = all_metrics(id_scores, scores)
        out[name] = {k: m[k] for k in METRICS}
    out["mean"] = {k: float(np.mean([out[n][k] for n in ood_scores])) for k in METRICS}
    return out


def evaluate_run(
    id_test: FeatureSet,
    ood: Mapping[str, FeatureSet],
    detectors: Sequence[str] | Mapping[str, dict] | None = None,
    train: FeatureSet | None = None,
    groups: Mapping[str, Sequence[str]] | None = None,
    rows_out: list | None = None,
    draws: int = 0,
    seed: int = 0,
) -> dict:
    """One model (one seed): ID accuracy and, per detector, metrics per set, mean and group means.

    ``detectors``: names, or {label: {"name": registry name, **hyperparameters}}; default: every
    registered detector that declares it reads the outlier class (the CnC detector). ``train``: the
    ID-train FeatureSet for detectors that fit. ``groups``: {group: set names} (e.g. near/far).
    Each detector is built by :func:`oodeval.scorer_factory.build_scorer` and runs through
    :func:`oodeval.evaluation.fit_score_evaluate`; a failure is a ValueError naming the detector.
    ``rows_out`` (a list) receives its rows (:func:`oodeval.results.result_row`, keyed by OOD set
    as ``ood``), one per OOD set, with the detector's label, registry name, backbone, explicit and
    resolved hyperparameters, and ``draws`` bootstrap bounds seeded by ``seed``.
    """
    from ..evaluation import fit_score_evaluate

    if id_test.labels is None or not (np.asarray(id_test.labels) >= 0).any():
        raise InputError("the ID test FeatureSet needs class labels for ID accuracy")
    if id_test.logits is None:
        raise InputError("the ID test FeatureSet needs logits")
    if detectors is None:
        detectors = outlier_class_readers()
    specs = {d: {"name": d} for d in detectors} if not isinstance(detectors, Mapping) else dict(detectors)
    k = _num_id_classes(id_test)
    check_id_labels(id_test.labels, k, "the ID test FeatureSet")
    result: dict = {
        "id_accuracy": accuracy(np.asarray(id_test.logits)[:, :k], np.asarray(id_test.labels)),
        "detectors": {},
    }
    sets = RunSets(train, id_test)
    for label, spec in specs.items():
        spec = dict(spec)
        name = spec.pop("name", label)
        scorer = build_scorer(name, spec, sets)
        rows = list(fit_score_evaluate(scorer, scorer.train, id_test, ood, draws=draws, seed=seed))
        failed = [r["error"] for r in rows if r["status"] != "ok"]
        if failed:
            raise InputError(f"detector {label!r} failed: {failed[0]}")
        per = {r["ood"]: {m: r[m] for m in METRICS} for r in rows}
        entry = {"sets": per, "mean": {m: float(np.mean([per[s][m] for s in ood])) for m in METRICS}}
        if groups:
            entry["groups"] = {
                g: {m: float(np.mean([per[s][m] for s in members])) for m in METRICS} for g, members in groups.items()
            }
        result["detectors"][label] = entry
        if rows_out is not None:
            rows_out += [result_row(r, scorer, label=label, id_accuracy=result["id_accuracy"]) for r in rows]
    return result


def aggregate(runs: Sequence[dict], ddof: int = 1) -> dict:
    """Mean ± std over runs (seeds) of every number in :func:`evaluate_run` results.

    Leaves become ``{"mean", "std", "ddof", "n"}`` (:func:`oodeval.stats.mean_std`); every run
    must have the same detectors and sets.
    """
    if not runs:
        raise InputError("no runs to aggregate")

    def walk(items: list):
        first = items[0]
        if isinstance(first, Mapping):
            keys = list(first)
            for i, it in enumerate(items[1:], 2):
                if list(it) != keys:
                    raise InputError(f"run {i} has keys {sorted(it)}, run 1 has {sorted(keys)}")
            return {k: walk([it[k] for it in items]) for k in keys}
        s = mean_std(np.asarray(items, dtype=np.float64), ddof=ddof)
        return {"mean": float(s["mean"]), "std": float(s["std"]), "ddof": ddof, "n": s["n"]}

    if len(runs) <= ddof:
        raise InputError(f"{len(runs)} run(s) cannot give a std with ddof={ddof}; need at least {ddof + 1}")
    return walk(list(runs))


def _fmt(v) -> str:
    if isinstance(v, Mapping):
        return f"{100 * v['mean']:.2f} ± {100 * v['std']:.2f}"
    return f"{100 * v:.2f}"


def format_cnc_table(result: dict, per_set: bool = True, title: str | None = None) -> str:
    """A plain-text table in percent (pandas ``to_string``): one row per (detector, OOD set / group / mean).

    Accepts one :func:`evaluate_run` result or an :func:`aggregate` of several (mean ± std).
    """
    header = ["detector", "OOD set"] + [_LABELS[m] for m in METRICS] + [_LABELS["id_accuracy"]]
    rows = []
    acc = _fmt(result["id_accuracy"])
    for det, entry in result["detectors"].items():
        items = list(entry["sets"].items()) if per_set else []
        items += [(f"[{g}]", v) for g, v in entry.get("groups", {}).items()]
        items.append(("mean", entry["mean"]))
        for set_name, vals in items:
            rows.append([det, set_name] + [_fmt(vals[m]) for m in METRICS] + [acc])
    import pandas as pd

    lines = [title] if title else []
    lines.append(pd.DataFrame(rows, columns=header).to_string(index=False))
    if isinstance(result["id_accuracy"], Mapping):
        a = result["id_accuracy"]
        lines.append(f"(percent; mean ± std over {a['n']} runs, std with ddof={a['ddof']})")
    else:
        lines.append("(percent; one run)")
    return "\n".join(lines)
