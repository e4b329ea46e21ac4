"""Fit-then-score detectors on cached features and evaluate every (ID, OOD) cell.

:func:`fit_score_evaluate` is the one loop behind ``oodeval score``, the experiment grid and
``oodeval cnc evaluate``: one fit per detector on its fitting rows, one score pass over the
ID-test set and each OOD set, metrics and bootstrap CIs from :func:`cell_metrics` (fractions; ID
positive, higher score = ID), failures as error rows. The detector it runs is built by the seam
:func:`oodeval.scorer_factory.build_scorer` (backbone defaults, fitting rows, seed, view); the rows of
:func:`evaluate_detectors` by :func:`oodeval.results.result_row`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping

from . import detectors
from .errors import InputError
from .features import FeatureSet
from .features.views import id_view
from .metrics import all_metrics, fpr95_columns, full_spectrum_metrics, selective_metrics
from .params import check_hyperparameters, refuse
from .results import ALL_SPLIT, BOOTSTRAPPED, result_row
from .detectors import profiles
from .scorer_factory import RunSets, build_scorer
from .stats import bootstrap, bootstrap_selective, confidence_interval

__all__ = ["check_request", "with_profiles", "evaluate_detectors", "supported_names", "parse_hyperparameters", "format_table", "failures",
           "cell_metrics", "selective_cell_metrics", "id_correct", "fit_score_evaluate"]  # fmt: skip


def parse_hyperparameters(items: list[str]) -> dict[str, dict[str, object]]:
    """``["knn.k=50", "energy.temperature=2"]`` -> ``{"knn": {"k": 50}, "energy": {"temperature": 2}}``.

    A ``module.path:Class`` detector's key splits at the last dot, after the colon
    (``mypkg.sub:MyDet.k=5`` -> ``{"mypkg.sub:MyDet": {"k": 5}}``). Values are parsed as JSON when
    possible (numbers, true/false, null, lists), else kept as text.
    """
    out: dict[str, dict[str, object]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        name, dot, param = key.rpartition(".") if ":" in key else key.partition(".")
        if not (sep and dot and name and param) or ":" in param:
            raise InputError(f"hyperparameter {item!r} is not of the form DETECTOR.NAME=VALUE")
        try:
            parsed: object = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        out.setdefault(name.strip(), {})[param.strip()] = parsed
    return out


def supported_names(train: FeatureSet | None, test: FeatureSet, oods: Mapping[str, FeatureSet], tapped: FeatureSet | None = None) -> list[str]:
    """The registered detectors the ID-test and every OOD FeatureSet support, fitted on ``train``
    (or, for a detector that declares ``fits_on``, on ``tapped`` when given), in registry order."""
    def fit_on(name: str) -> FeatureSet | None:
        return tapped if tapped is not None and detectors.REGISTRY[name].fits_on is not None else train

    return [n for n in detectors.default_names() if all(detectors.supported(fit_on(n), x, [n]) for x in (test, *oods.values()))]


def check_request(names: list[str] | None, hyperparameters: Mapping[str, Mapping[str, object]] | None) -> None:
    """One InputError for every unknown detector, unknown hyperparameter name or value its declared
    constraint refuses (:mod:`oodeval.params`), before anything runs."""
    hyperparameters = dict(hyperparameters or {})
    names = [_canonical(detectors.registry_name(n)) for n in names or ()]
    hyperparameters = {_canonical(detectors.registry_name(n)): hp for n, hp in hyperparameters.items()}
    unknown = sorted((set(names) | set(hyperparameters)) - set(detectors.names()))
    if unknown:
        raise InputError(f"unknown detectors {unknown}; known: {', '.join(detectors.names())}")
    refuse([p for name, hp in hyperparameters.items() for p in check_hyperparameters(detectors.REGISTRY[name], profiles.split_profile(hp)[1])])


def with_profiles(names: list[str] | None, hyperparameters: Mapping[str, Mapping[str, object]] | None,
                  defaults: str | None = None) -> tuple[list[str] | None, dict[str, dict]]:
    """``names`` as oodeval's (None stays None) and the hyperparameters keyed by oodeval's names,
    each detector's defaults profile in its ``defaults`` key (left out for paper): its own
    ``defaults`` hyperparameter, else the peer's whose name it was given by (``ash``: openood,
    ``KNN``: pytorch-ood), else ``defaults`` (the run's, None: paper;
    :func:`oodeval.detectors.profiles.resolve_profile`)."""
    hps: dict[str, dict] = {}
    for raw, hp in (hyperparameters or {}).items():
        name = _canonical(detectors.registry_name(raw))
        hps[name] = profiles.resolve_profile(raw, defaults, {**hps.get(name, {}), **hp})[1]
    if names is None:
        return None, hps
    out = []
    for raw in names:
        name = _canonical(detectors.registry_name(raw))
        out.append(name)
        if name in detectors.REGISTRY:
            hps[name] = profiles.resolve_profile(raw, defaults, hps.get(name))[1]
    return out, {n: hp for n, hp in hps.items() if hp or n not in out}


def _canonical(name: str) -> str:
    """A peer's detector name (``ebo``, ``EnergyBased``) as oodeval's; other names unchanged (an
    unknown one is refused below, with the list of known ones)."""
    return detectors.canonical(name) if name in detectors.REGISTRY else name


def evaluate_detectors(
    train: FeatureSet,
    test: FeatureSet,
    oods: Mapping[str, FeatureSet],
    names: list[str] | None = None,
    hyperparameters: Mapping[str, Mapping[str, object]] | None = None,
    scores_out: dict | None = None,
    progress: bool = True,
    tapped: FeatureSet | None = None,
    draws: int = 0,
    seed: int = 0,
    fixed_id: bool = True,
    defaults: str | None = None,
) -> list[dict]:
    """One row per (detector, OOD set) (:func:`oodeval.results.result_row`): detector, ood, status
    ``ok``, n_id, n_ood, fpr95, fpr95_ood_positive, tnr95, auroc, aupr_in, aupr_out, detection_error
    (fractions), fit seconds and score seconds (ID test + that set), the backbone family, the
    explicit hyperparameters and every hyperparameter the detector ran with (``hyperparameters`` /
    ``hyperparameters_resolved``, JSON, as in a results table); with ``draws`` > 0 also the
    bootstrap bounds of :func:`cell_metrics` (seeded by ``seed``) and ``ci_resamples``. Each
    detector is built by :func:`oodeval.scorer_factory.build_scorer` and runs through :func:`fit_score_evaluate`.

    ``names`` defaults to every detector the FeatureSets support (:func:`detectors.supported`,
    checked against the test and every OOD set). A detector that fails (its fit, the ID-test set
    or one OOD set: bad hyperparameters for this data, NaN/inf inputs, a set that does not match
    the ID-train set) gets rows with status ``error`` and the message in ``error``, and the loop
    goes on. ``hyperparameters`` maps a detector name to constructor overrides; an unknown detector
    or hyperparameter name is a ValueError before anything runs. Every other hyperparameter that
    depends on the backbone recorded in the set a detector fits on takes that backbone's release
    default (:func:`detectors.defaults.resolve_defaults`). When ``scores_out`` is a dict it
    receives ``scores_out[detector] = {"id": ..., ood_name: ...}`` for the sets that scored.
    ``tapped`` is the FeatureSet a detector that declares ``fits_on`` fits on instead of ``train``
    (NAC's tapped fitting rows, :func:`oodeval.features.extract.extract_nac_fit`). ``defaults``
    is the defaults profile (``paper``, ``openood``, ``pytorch-ood``; None: paper, and a peer's
    name its peer's) of every detector not given one (:func:`with_profiles`).
    """
    if not oods:
        raise InputError("evaluate_detectors needs at least one OOD FeatureSet")
    names, hyperparameters = with_profiles(names, hyperparameters, defaults)
    if names is None:
        names, hyperparameters = with_profiles(supported_names(train, test, oods, tapped), hyperparameters, defaults)
    check_request(names, hyperparameters)
    sets = RunSets(train, test, None if tapped is None else (lambda size, seed: tapped))
    rows: list[dict] = []
    for name in _progress(names, progress):
        scorer = build_scorer(name, hyperparameters.get(name), sets)
        out: dict = {}
        for row in fit_score_evaluate(scorer, scorer.train, test, oods, draws=draws, seed=seed, fixed_id=fixed_id, scores_out=out):
            row.pop("split"), row.pop("seed")
            if row["status"] == "ok" and draws:
                row["ci_resamples"] = "OOD (ID fixed)" if fixed_id else "ID and OOD"
            rows.append(result_row(row, scorer, resolved=row["status"] == "ok"))
        if scores_out is not None and "id" in out:
            scores_out[name] = out
    return rows


def fit_score_evaluate(
    det,
    train: FeatureSet | None,
    test: FeatureSet,
    oods: Mapping[str, FeatureSet | BaseException],
    *,
    cells: Mapping[str, list[tuple[str, int, object]]] | None = None,
    draws: int = 0,
    seed: int = 0,
    fixed_id: bool = True,
    scores_out: dict | None = None,
    csid: Mapping[str, FeatureSet | BaseException] | None = None,
) -> Iterator[dict]:
    """The one fit -> score -> evaluate loop of ``oodeval score``, the experiment grid and ``cnc evaluate``.

    ``det`` (anything with ``fit(train)`` and ``score(fs)``) is fitted once on ``train``, scores
    ``test`` once and each OOD set once; every cell of a set then gets :func:`cell_metrics`
    (``draws`` bootstrap resamples, seeded by the cell's seed). ``cells`` maps an OOD set to its
    cells ``(split, seed, mask)`` (mask None: the whole set); default one cell per set,
    ``(results.ALL_SPLIT, seed, None)``. An OOD set given as an exception stands for a set that could
    not be loaded. Yields one row per cell as soon as it is evaluated (a caller can keep each
    before the next is computed): ood, split, seed, status, and either the metrics with fit_seconds /
    score_seconds, or ``error``: the stage that failed and its message (a failed fit or ID-test score
    fails every cell). ``scores_out`` receives ``"id"`` and each set's scores before its cells.
    ``csid`` (full-spectrum OOD): covariate-shifted ID sets, scored once each after the ID-test set;
    every cell then also carries :func:`oodeval.metrics.full_spectrum_metrics` (csID counted as ID),
    ``csid`` and ``csid_accuracy`` (JSON label -> the classifier's accuracy there; null without
    logits or labels). A csID set that cannot be scored fails every cell.
    """
    cells = {name: list((cells or {}).get(name, [(ALL_SPLIT, seed, None)])) for name in oods}
    if getattr(det, "test_time", False):
        yield from _test_time_cells(det, test, oods, cells, draws, fixed_id)
        return
    t0 = time.perf_counter()
    try:
        stage = "fit on the ID-train set"
        det.fit(train)
        fit_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        stage = "scoring the ID-test set"
        id_scores = det.score(test)
        id_s = time.perf_counter() - t0
    except Exception as err:  # noqa: BLE001 - recorded as this detector's failure, the caller goes on
        yield from (_failed(o, c, f"{stage}: {_message(err)}") for o in oods for c in cells[o])
        return
    if scores_out is not None:
        scores_out["id"] = id_scores
    correct = id_correct(test)
    try:
        per_detector = {} if correct is None else selective_cell_metrics(id_scores, correct, seed=seed, draws=draws)
    except Exception as err:  # noqa: BLE001
        yield from (_failed(o, c, f"AURC/AUGRC of the ID-test set: {_message(err)}") for o in oods for c in cells[o])
        return
    csid_scores: dict = {}
    for name, fs in (csid or {}).items():
        try:
            if isinstance(fs, BaseException):
                raise fs
            csid_scores[name] = det.score(fs)
        except Exception as err:  # noqa: BLE001
            yield from (_failed(o, c, f"scoring csID set {name!r}: {_message(err)}") for o in oods for c in cells[o])
            return
    if csid_scores:
        per_detector |= {"csid": ",".join(csid_scores), "csid_accuracy": json.dumps({n: _accuracy(fs) for n, fs in csid.items()})}
        if scores_out is not None:
            scores_out.update({f"csid:{n}": v for n, v in csid_scores.items()})
    for ood_name, fs in oods.items():
        t1 = time.perf_counter()
        try:
            if isinstance(fs, BaseException):
                raise fs
            s = det.score(fs)
        except Exception as err:  # noqa: BLE001
            yield from (_failed(ood_name, c, f"scoring OOD set {ood_name!r}: {_message(err)}") for c in cells[ood_name])
            continue
        if scores_out is not None:
            scores_out[ood_name] = s
        score_s = id_s + time.perf_counter() - t1
        for split, cell_seed, mask in cells[ood_name]:
            try:
                metrics = cell_metrics(id_scores, s if mask is None else s[mask], seed=cell_seed, draws=draws, fixed_id=fixed_id)
                if csid_scores:
                    metrics |= full_spectrum_metrics(id_scores, list(csid_scores.values()), s if mask is None else s[mask])
            except Exception as err:  # noqa: BLE001
                yield _failed(ood_name, (split, cell_seed), f"evaluating OOD set {ood_name!r}: {_message(err)}")
                continue
            yield {"ood": ood_name, "split": split, "seed": cell_seed, "status": "ok", **metrics, **per_detector,
                   "fit_seconds": round(fit_s, 4), "score_seconds": round(score_s, 4)}  # fmt: skip


def _test_time_cells(det, test: FeatureSet, oods: Mapping, cells: Mapping, draws: int, fixed_id: bool) -> Iterator[dict]:
    """The cells of a test-time scorer (``det.score_pair``): each (OOD set, seed) is one stream of the
    ID-test and that OOD set in stream order = the cell's seed, with fresh state; the stream's settings
    go to the ``stream`` column. Scores are not kept (they differ per OOD set and order)."""
    import numpy as np

    for ood_name, fs in oods.items():
        by_order: dict[int, tuple] = {}
        for split, cell_seed, mask in cells[ood_name]:
            t0 = time.perf_counter()
            try:
                if isinstance(fs, BaseException):
                    raise fs
                if cell_seed not in by_order:
                    by_order[cell_seed] = det.score_pair(test, fs, cell_seed)
                s_id, s_ood, info = by_order[cell_seed]
                s_ood = s_ood if mask is None else s_ood[mask]
                metrics = cell_metrics(s_id[~np.isnan(s_id)], s_ood[~np.isnan(s_ood)], seed=cell_seed, draws=draws, fixed_id=fixed_id)
            except Exception as err:  # noqa: BLE001
                yield _failed(ood_name, (split, cell_seed), f"scoring the stream of ID-test and {ood_name!r}: {_message(err)}")
                continue
            yield {"ood": ood_name, "split": split, "seed": cell_seed, "status": "ok", **metrics, "fit_seconds": 0.0,
                   "score_seconds": round(time.perf_counter() - t0, 4), "stream": json.dumps(info, sort_keys=True)}  # fmt: skip


def _message(err: BaseException) -> str:
    return str(err) if isinstance(err, ValueError | RuntimeError) else f"{type(err).__name__}: {err}"


def _failed(ood: str, cell: tuple, message: str) -> dict:
    return {"ood": ood, "split": cell[0], "seed": cell[1], "status": "error", "error": message}


def failures(rows: list[dict]) -> list[str]:
    """``detector / ood: message`` for each failed row of :func:`evaluate_detectors`."""
    return [f"{r['detector']} / {r['ood']}: {r['error']}" for r in rows if r.get("status") == "error"]


def _progress(names: list[str], enabled: bool):
    if not enabled:
        return names
    from tqdm import tqdm

    return tqdm(names, desc="detectors", unit="det", leave=False)


def format_table(rows: list[dict], convention: str = "paper") -> str:
    """Text table (pandas ``to_string``): one line per detector, both FPR@95 conventions and AUROC
    (%) per OOD set, the ``convention`` one first (:func:`oodeval.metrics.fpr95_columns`); "failed"
    where that detector failed on that set, "-" where it did not run, "n/a" for a value a row
    lacks (a results table written before ``fpr95_ood_positive`` existed)."""
    import pandas as pd


    conventions = fpr95_columns(convention)
    metrics = [c[0] for c in conventions] + ["auroc"]
    df = pd.DataFrame(rows).reindex(columns=["detector", "ood", "status", *metrics])

    def cell(r) -> str:
        if r["status"] == "error":
            return "failed"
        return " / ".join("n/a" if pd.isna(r[m]) else f"{100 * r[m]:.2f}" for m in metrics)

    df["cell"] = [cell(r) for _, r in df.iterrows()]
    table = df.pivot(index="detector", columns="ood", values="cell")
    table = table.reindex(index=df["detector"].unique(), columns=df["ood"].unique()).fillna("-")
    head = " / ".join([c[1] for c in conventions] + ["AUROC"]) + " (%) per OOD set"
    legend = "; ".join(f"{label}: {meaning}" for _, label, meaning in conventions)
    return f"{head}\n{legend}\n" + table.rename_axis(index=None, columns=None).to_string()


def cell_metrics(id_scores, ood_scores, seed: int = 0, draws: int = 1000, fixed_id: bool = True) -> dict:
    """Every metric of one (ID, OOD) pair (fractions) with percentile 95% bootstrap bounds
    ``<metric>_lo`` / ``<metric>_hi`` for fpr95, fpr95_ood_positive, tnr95, auroc, detection_error
    (:func:`oodeval.stats.bootstrap`: OOD resampled with the ID set fixed, the paper's App. C
    protocol, or both sets resampled when ``fixed_id`` is False); ``draws=0``: the metrics alone."""
    import numpy as np


    id_scores, ood_scores = np.asarray(id_scores), np.asarray(ood_scores)
    out: dict = {k: float(v) for k, v in all_metrics(id_scores, ood_scores).items()}
    out["n_id"], out["n_ood"] = int(id_scores.size), int(ood_scores.size)
    if draws == 0:
        return out
    boot = bootstrap(id_scores, ood_scores, draws=draws, seed=seed, fixed_id=fixed_id)
    for m in BOOTSTRAPPED:
        if m in boot:
            lo, hi = confidence_interval(boot[m][0])
            out[f"{m}_lo"], out[f"{m}_hi"] = float(lo), float(hi)
    return out


def id_correct(test: FeatureSet):
    """Per ID sample, 1 where the classifier is right (argmax of the K-way logits, a CnC model's
    outlier logit left out, :func:`oodeval.features.views.id_view`), 0 where wrong, -1 where the
    sample has no label; None without logits or labels."""
    import numpy as np

    view = id_view(test)
    if view.logits is None or view.labels is None:
        return None
    labels = np.asarray(view.labels)
    logits = np.asarray(view.logits)
    if logits.ndim != 2 or labels.shape != (logits.shape[0],) or not (labels >= 0).any() or labels.max() >= logits.shape[1]:
        return None
    return np.where(labels >= 0, (logits.argmax(axis=1) == labels).astype(np.int64), -1)


def _accuracy(fs: FeatureSet) -> float | None:
    """The classifier's accuracy on a labelled FeatureSet (:func:`id_correct`); None without logits or labels."""
    correct = id_correct(fs)
    return None if correct is None else float(correct[correct >= 0].mean())


def selective_cell_metrics(id_scores, correct, seed: int = 0, draws: int = 1000) -> dict:
    """AURC and AUGRC (fractions) of the ID scores as the confidence of the classifier whose
    correctness is ``correct`` (:func:`id_correct`: 1 right, 0 wrong, -1 unlabelled and left out), with
    percentile 95% bootstrap bounds from :func:`oodeval.stats.bootstrap_selective` (the ID samples
    resampled) when ``draws`` > 0."""
    import numpy as np

    correct = np.asarray(correct)
    keep = correct >= 0
    scores = np.asarray(id_scores)[keep]
    out = selective_metrics(scores, correct[keep] == 1)
    if draws:
        boot = bootstrap_selective(scores, correct[keep] == 1, draws=draws, seed=seed)
        for m, v in boot.items():
            lo, hi = confidence_interval(v)
            out[f"{m}_lo"], out[f"{m}_hi"] = float(lo), float(hi)
    return out
