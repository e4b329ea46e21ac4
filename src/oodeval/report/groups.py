"""OOD-group means per detector, as OpenOOD v1.5 reports them (its evaluator's ``nearood`` /
``farood`` rows, its leaderboard's Near-OOD / Far-OOD columns).

Per model and detector, for each group of the experiment's OOD sets (``group = "near"`` / ``"far"``,
e.g. an ``[openood]`` benchmark): the plain mean over *every* set of the group (OpenOOD's
``np.mean(metrics_list, axis=0)``; unlike Tab. A2, no set is held out as primary) of FPR@95 with
OOD positive (OpenOOD's), FPR@95 with ID positive (the paper's) and AUROC, each run first averaged
over seeds. A group mean over fewer sets than the group has (a cell failed or was not run) is
not a group mean: the cell shows "–" and the caption names the missing sets.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .views import View, full_split, order_detectors, pct, register_view

__all__ = ["group_means"]

_OOD_POS, _OOD_POS_LABEL = "fpr95_ood_positive", "FPR@95 OOD-pos"


@register_view("tabGroups", order=55, needs=("frame", "groups", "convention"))
def group_means(frame: pd.DataFrame, groups: dict[str, str] | None, convention: str = "paper") -> View:
    """The table (see the module doc); omitted without groups."""
    title = "OOD groups — mean per detector over each group's sets (OpenOOD's near / far)"
    caption = ("Per model and detector, the mean over all OOD sets of each group (%; no CI) of OpenOOD's FPR@95 (OOD positive: "
               "ID rejected at 95% OOD recall), the paper's FPR@95 (ID positive: OOD accepted at 95% ID recall) and AUROC, "
               "as OpenOOD v1.5 averages its near-OOD and far-OOD sets; ID Acc: ID-test accuracy (%).")
    if not groups:
        return View("tabGroups", title, caption, note="omitted: the experiment declares no OOD groups")
    f = full_split(frame)
    f = f[f["vocabulary"].isna() & f["dataset"].isin(list(groups))]
    if len(f) == 0:
        return View("tabGroups", title, caption, note="omitted: no results on a grouped OOD set")
    members = {g: [d for d, gg in groups.items() if gg == g] for g in dict.fromkeys(groups.values())}
    metrics = [(_OOD_POS, _OOD_POS_LABEL), ("fpr95", "FPR@95"), ("auroc", "AUROC")]
    if convention != "openood":
        metrics = metrics[1:] + metrics[:1]
    rows, gaps = [], []
    for m in dict.fromkeys(f["model"]):
        fm = f[f["model"] == m]
        for det in order_detectors(list(fm["det"])):
            g = fm[fm["det"] == det].set_index("dataset")
            row = {"Model": m, "Detector": det, "ID Acc": pct(float(g["id_accuracy"].mean()))}
            for group, sets in members.items():
                absent = [d for d in sets if d not in g.index]
                if absent:
                    gaps.append(f"{m} / {det} / {group}: no result on {', '.join(absent)}")
                for col, label in metrics:
                    values = g[col].reindex(sets) if col in g else pd.Series(np.nan, index=sets)
                    row[f"{group} {label}"] = "–" if absent or values.isna().any() else pct(float(values.mean()))
            rows.append(row)
    caption += " Groups: " + "; ".join(f"{g}: {', '.join(s)}" for g, s in members.items()) + "."
    if gaps:
        caption += " Not averaged (a group mean needs every set of its group): " + "; ".join(gaps) + "."
    return View("tabGroups", title, caption, pd.DataFrame(rows))
