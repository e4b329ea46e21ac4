"""The CnC-style summary (Hebbalaguppe et al. 2022, arXiv:2207.13916).

Per model and detector: TNR@TPR95, AUROC and detection error on every OOD set (whole sets) and
their mean over the OOD sets, plus the ID-test accuracy; each as mean ± std over the runs (seeds,
or per-seed weights) via ``oodeval.stats.mean_std`` with ddof=1 (the sample std over 3 runs, as CnC
reports). The mean over OOD sets is taken per run first, then averaged over runs. All in %.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..results import ALL_SPLIT
from ..stats import mean_std
from .views import Cell, View, add_det, register_view

__all__ = ["cnc_summary", "DDOF"]

DDOF = 1
_METRICS = (("tnr95", "TNR@TPR95"), ("auroc", "AUROC"), ("detection_error", "Det. err"), ("id_accuracy", "ID acc"))


def _fmt(values: np.ndarray) -> str:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return "–"
    if values.size <= DDOF:
        return f"{100 * values.mean():.2f}"
    s = mean_std(values, ddof=DDOF)
    return f"{100 * s['mean']:.2f} ± {100 * s['std']:.2f}"


@register_view("cnc", order=120, needs=("results",))
def cnc_summary(df: pd.DataFrame) -> View:
    """One row per (model, detector, OOD set) and a mean-over-OOD-sets row per (model, detector)."""
    title = "CnC-style summary"
    caption = (
        "TNR@TPR95, AUROC, detection error (min over thresholds of (FNR+FPR)/2) and ID accuracy, in %, "
        f"as mean ± std over runs (seeds; std with ddof={DDOF}; a single run shows its value alone). "
        "'mean over OOD sets' averages the OOD sets within each run first."
    )
    ok = add_det(df[(df["status"] == "ok") & (df["split"] == ALL_SPLIT)])
    if len(ok) == 0:
        return View("cnc", title, caption, note="omitted: no results")
    ok = ok.assign(run=ok["seed"].astype(str) + "|" + ok["weights"].astype(str))
    rows = []
    for (model, det), g in ok.groupby(["model", "det"], sort=False):
        runs = g["run"].nunique()
        for dataset, d in g.groupby("dataset", sort=False):
            rows.append({"Model": model, "Detector": det, "OOD set": dataset, "runs": str(runs), **{name: _fmt(d[col].to_numpy(float)) for col, name in _METRICS}})
        per_run = g.groupby("run")[[c for c, _ in _METRICS]].mean()
        rows.append(
            {
                "Model": model,
                "Detector": det,
                "OOD set": Cell("mean over OOD sets", bold=True),
                "runs": str(runs),
                **{name: Cell(_fmt(per_run[col].to_numpy(float)), bold=True) for col, name in _METRICS},
            }
        )
    return View("cnc", title, caption, pd.DataFrame(rows))
