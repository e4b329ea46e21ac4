"""The CnC-style summary (Hebbalaguppe et al. 2022, arXiv:2207.13916).

Per model, detector and *group of like runs*: TNR@TPR95, AUROC and detection error on every OOD
set (whole sets) and their mean over the OOD sets, plus the ID-test accuracy; each as mean ± std
over the group's runs (seeds, or per-seed weights) via ``oodeval.stats.mean_std`` with ddof=1
(the sample std; oodeval's choice, the paper says only "averaged on 3 evaluation runs"). The mean
over OOD sets is taken per run first, then averaged over runs. All in %.

Runs are averaged only when ``oodeval cnc evaluate`` would average them: one group per model,
detector, ID test and train set, and, for the rows ``cnc evaluate --results`` writes, training
configuration without the seed (``train_config``), data hash, epochs reached, finished or not,
and the device / precision of training and scoring (:data:`GROUP_BY`). Each group lists its runs.
"""

from __future__ import annotations

from pathlib import PurePath

import numpy as np
import pandas as pd

from ..results import ALL_SPLIT
from ..stats import mean_std
from .labels import det_cell
from .views import Cell, View, add_det, register_view

__all__ = ["cnc_summary", "DDOF", "GROUP_BY"]

DDOF = 1
_METRICS = (("tnr95", "TNR@TPR95"), ("auroc", "AUROC"), ("detection_error", "Det. err"), ("id_accuracy", "ID acc"))
#: columns whose values must agree for runs to be averaged (absent columns count as one value)
GROUP_BY = ("id_test", "id_train", "train_config", "data_hash", "epochs_done", "finished", "trained_on", "scored_on")


def _fmt(values: np.ndarray) -> str:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return "–"
    if values.size <= DDOF:
        return f"{100 * values.mean():.2f}"
    s = mean_std(values, ddof=DDOF)
    return f"{100 * s['mean']:.2f} ± {100 * s['std']:.2f}"


def _describe(key: dict, runs: pd.DataFrame) -> str:
    """What the group's runs share and which runs they are."""
    parts = [f"ID {key['id_test']}" if key["id_test"] else "ID ?"]
    if key["epochs_done"] != "":
        epochs = f"{key['epochs_done']} epochs"
        parts.append(epochs if key["finished"] in ("", True, "True") else f"{epochs}, UNFINISHED")
    if key["train_config"]:
        parts.append(f"config {str(key['train_config'])[:8]}")
    if key["data_hash"]:
        parts.append(f"data {str(key['data_hash'])[:8]}")
    if key["trained_on"] or key["scored_on"]:
        parts.append(f"trained on {key['trained_on'] or '?'}, scored on {key['scored_on'] or '?'}")
    names = [f"{PurePath(w).name} (seed {s})" if w else f"seed {s}" for s, w in runs[["seed", "weights"]].drop_duplicates().itertuples(index=False)]
    return "; ".join(parts) + " — runs: " + ", ".join(names)


@register_view("cnc", order=120, needs=("results",))
def cnc_summary(df: pd.DataFrame) -> View:
    """One row per (model, detector, group, OOD set) and a mean-over-OOD-sets row per (model, detector, group)."""
    title = "CnC-style summary"
    caption = (
        "TNR@TPR95, AUROC, detection error (min over thresholds of (FNR+FPR)/2) and ID accuracy, in %, "
        f"as mean ± std over the runs of one group (seeds; std with ddof={DDOF}, the sample std; a single run "
        "shows its value alone). A group holds only like runs: same model, ID sets, training configuration "
        "(seed aside), data, epochs reached, device and precision. 'mean over OOD sets' averages the OOD sets "
        "within each run first."
    )
    ok = add_det(df[(df["status"] == "ok") & (df["split"] == ALL_SPLIT)])
    if len(ok) == 0:
        return View("cnc", title, caption, note="omitted: no results")
    ok = ok.assign(run=ok["seed"].astype(str) + "|" + ok["weights"].astype(str), weights=ok["weights"].fillna("").astype(str))
    for col in GROUP_BY:
        ok[col] = ok[col].astype(object).where(ok[col].notna(), "") if col in ok else ""
    rows = []
    for (model, det, *key), g in ok.groupby(["model", "det", *GROUP_BY], sort=False):
        runs = g["run"].nunique()
        group = _describe(dict(zip(GROUP_BY, key)), g)
        for dataset, d in g.groupby("dataset", sort=False):
            rows.append({"Model": model, "Detector": det_cell(det), "Group": group, "OOD set": dataset, "runs": str(runs),
                         **{name: _fmt(d[col].to_numpy(float)) for col, name in _METRICS}})  # fmt: skip
        per_run = g.groupby("run")[[c for c, _ in _METRICS]].mean()
        rows.append(
            {
                "Model": model,
                "Detector": det_cell(det),
                "Group": group,
                "OOD set": Cell("mean over OOD sets", bold=True),
                "runs": str(runs),
                **{name: Cell(_fmt(per_run[col].to_numpy(float)), bold=True) for col, name in _METRICS},
            }
        )
    return View("cnc", title, caption, pd.DataFrame(rows))
