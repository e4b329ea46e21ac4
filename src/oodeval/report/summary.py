"""The run summary the report opens with: what was run (models, OOD sets, detectors, cells), which
FPR@95 convention leads, and every view or figure left out for want of data, with the reason, in
one short list (instead of a section per omitted view)."""

from __future__ import annotations

import pandas as pd

from .labels import detector_label
from .views import Figure, View, mark_zero_shot

__all__ = ["run_summary"]


def run_summary(df: pd.DataFrame, views: list[View], figures: list[Figure], choice: dict, convention: str = "paper") -> list[tuple[str, list[str]]]:
    """``[(line, sub-items), ...]`` for the top of the report; ``df`` the rows shown (ok and failed)."""
    ok = df[df["status"] == "ok"]
    kinds = ok.groupby("model", sort=False)["kind"].first() if len(ok) else pd.Series(dtype=str)
    random = set(df.loc[df["random_init"].fillna(False).astype(bool), "model"])
    models = [f"{m} ({kinds.get(m, '?')}{', RANDOM-INIT weights' if m in random else ''})" for m in dict.fromkeys(df["model"])]
    labels = mark_zero_shot(ok["label"].fillna(ok["detector"]).astype(str), ok["kind"]) if len(ok) else pd.Series(dtype=str)
    detectors = [f"{detector_label(d)} ({d})" if detector_label(d) != d else d for d in dict.fromkeys(labels)]
    sets = list(dict.fromkeys(df["dataset"]))
    n_err = int((df["status"] != "ok").sum())
    lead = ("FPR@95 OOD-pos (OpenOOD, pytorch-ood: ID rejected at 95% OOD recall) leads in Tabs. 1 and A1, the paper's beside it"
            if convention == "openood" else
            "FPR@95 is the paper's (ID positive: OOD accepted at 95% ID recall); FPR@95 OOD-pos (OpenOOD, pytorch-ood) beside it in Tabs. 1 and A1")  # fmt: skip
    out: list[tuple[str, list[str]]] = [
        (f"Models ({len(models)}): {', '.join(models)}", []),
        (f"OOD sets ({len(sets)}): {', '.join(sets)}; primary {choice.get('primary')}; figure model {choice.get('model')}", []),
        (f"Detectors ({len(detectors)}): {', '.join(detectors)}", []),
        (f"Cells: {len(ok)} evaluated, {n_err} failed (not shown); seeds {sorted(set(df['seed'].tolist()))}", []),
        (f"Conventions: {lead}", []),
    ]
    skipped = [f"{v.title}: {v.note}" for v in views if not v.present] + [f"{f.title}: {f.note}" for f in figures if not f.path]
    if skipped:
        out.append((f"Not shown, for want of data ({len(skipped)})", skipped))
    return out
