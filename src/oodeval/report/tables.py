"""The Fi-ImageNet-1k paper's tables from a prepared results frame (:func:`views.prepare`).

Values are percentages (FPR@95 lower is better, AUROC higher is better), means over seeds.
- Tab. 1: per model the best detector by FPR@95 and, independently, by AUROC on the primary set.
- Tab. A1: every detector x every supervised model, FPR@95 / AUROC; best FPR bold, best AUROC underlined.
- Tab. A2: every OOD set x every model, the best FPR@95 / best AUROC over detectors (chosen
  independently); a Mean row over the other sets and the primary set last, a Mean column over models.
- Tab. 2 / A5: zero-shot models x negative vocabularies (FPR@95), with the best logit-space detector.
- Tab. A4: fine-grained vs ordinary (split) rows x detectors, mean FPR@95 over models.
Vocabulary-based scorers are kept out of Tabs. 1, A1 and A2 (they are Tab. 2's subject).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..results import ALL_SPLIT
from .views import Cell, View, full_split, order_detectors, pct

__all__ = ["best_per_model", "detector_by_model", "dataset_by_model", "vocabularies", "vocabularies_by_dataset", "split_rows"]

_ORACLE = "oracle"


def _no_vocab(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["vocabulary"].isna()]


def _models(frame: pd.DataFrame, kind: str | None = None) -> list[str]:
    f = frame if kind is None else frame[frame["kind"] == kind]
    return list(dict.fromkeys(f["model"]))


def best_per_model(frame: pd.DataFrame, primary: str) -> View:
    """Tab. 1."""
    title = "Tab. 1 — best detector per model"
    caption = (
        f"Post-hoc OOD detection on {primary}. For every model the best detector by FPR@95 (%, lower is better) "
        "and, chosen independently, by AUROC (%, higher is better); Top-1 is the ID-test accuracy (%). "
        "Bold: best column value within each group (supervised / zero-shot)."
    )
    f = _no_vocab(full_split(frame))
    f = f[f["dataset"] == primary]
    if len(f) == 0:
        return View("tab1", title, caption, note=f"omitted: no results on {primary}")
    rows = []
    for kind in ("supervised", "zero-shot"):
        g = f[f["kind"] == kind]
        if len(g) == 0:
            continue
        best_fpr = g.loc[g.groupby("model", sort=False)["fpr95"].idxmin()]
        best_auc = g.loc[g.groupby("model", sort=False)["auroc"].idxmax()].set_index("model")
        top1 = g.groupby("model", sort=False)["id_accuracy"].mean()
        lo_fpr, hi_auc, hi_acc = best_fpr["fpr95"].min(), best_auc["auroc"].max(), top1.max()
        for _, r in best_fpr.iterrows():
            a = best_auc.loc[r["model"]]
            acc = top1[r["model"]]
            rows.append(
                {
                    "Group": kind,
                    "Model": r["model"],
                    "Top-1": Cell(pct(acc), bold=bool(np.isfinite(acc) and acc == hi_acc)),
                    "FPR@95": Cell(pct(r["fpr95"]), bold=bool(r["fpr95"] == lo_fpr)),
                    "FPR detector": r["det"],
                    "AUROC": Cell(pct(a["auroc"]), bold=bool(a["auroc"] == hi_auc)),
                    "AUROC detector": a["det"],
                }
            )
    return View("tab1", title, caption, pd.DataFrame(rows))


def detector_by_model(frame: pd.DataFrame, primary: str) -> View:
    """Tab. A1."""
    title = "Tab. A1 — every detector x every model"
    caption = (
        f"All post-hoc detectors on {primary}, FPR@95 (%) / AUROC (%). Per model the best FPR@95 is bold "
        "and the best AUROC underlined."
    )
    f = _no_vocab(full_split(frame))
    f = f[(f["dataset"] == primary) & (f["kind"] == "supervised")]
    if len(f) == 0:
        return View("tabA1", title, caption, note=f"omitted: no supervised-model results on {primary}")
    models = _models(f)
    dets = order_detectors(list(f["det"]))
    table = {d: {"Detector": d} for d in dets}
    for m in models:
        g = f[f["model"] == m].set_index("det")
        lo, hi = g["fpr95"].min(), g["auroc"].max()
        for d in dets:
            if d not in g.index:
                table[d][m] = Cell("–", muted=True)
                continue
            r = g.loc[d]
            table[d][m] = Cell(f"{pct(r['fpr95'])} / {pct(r['auroc'])}", bold=bool(r["fpr95"] == lo), underline=bool(r["auroc"] == hi))
    return View("tabA1", title, caption, pd.DataFrame(list(table.values())))


def dataset_by_model(frame: pd.DataFrame, primary: str) -> View:
    """Tab. A2."""
    title = "Tab. A2 — every OOD set x every model"
    caption = (
        "Best FPR@95 (%) / best AUROC (%) over the detectors, per model (supervised ones when there are any) and OOD set, the two metrics "
        f"selected independently. Mean: over the OOD sets above it; {primary} (the primary set) last."
    )
    f = _no_vocab(full_split(frame))
    if (f["kind"] == "supervised").any():
        f = f[f["kind"] == "supervised"]
    if len(f) == 0:
        return View("tabA2", title, caption, note="omitted: no results")
    models = _models(f)
    best = f.groupby(["dataset", "model"], sort=False).agg(fpr95=("fpr95", "min"), auroc=("auroc", "max")).reset_index()
    datasets = [d for d in dict.fromkeys(f["dataset"]) if d != primary]
    rows = []

    def row(name: str, sub: pd.DataFrame, bold: bool = False) -> dict:
        r = {"Dataset": Cell(name, bold=bold)}
        for m in models:
            s = sub[sub["model"] == m]
            r[m] = f"{pct(s['fpr95'].mean())} / {pct(s['auroc'].mean())}" if len(s) else Cell("–", muted=True)
        by_model = sub.groupby("model")[["fpr95", "auroc"]].mean()
        r["Mean"] = f"{pct(by_model['fpr95'].mean())} / {pct(by_model['auroc'].mean())}" if len(by_model) else "–"
        return r

    for d in datasets:
        rows.append(row(d, best[best["dataset"] == d]))
    if len(datasets) > 1:
        per_model = best[best["dataset"].isin(datasets)].groupby("model", sort=False)[["fpr95", "auroc"]].mean().reset_index()
        rows.append(row("Mean", per_model, bold=True))
    if primary in set(best["dataset"]):
        rows.append(row(primary, best[best["dataset"] == primary]))
    return View("tabA2", title, caption, pd.DataFrame(rows))


def _vocab_column(frame: pd.DataFrame) -> pd.Series:
    """Column name of a vocabulary row: the vocabulary, prefixed by the scorer when several scorers share it."""
    v = frame[frame["vocabulary"].notna()]
    shared = v.groupby("vocabulary")["detector"].nunique() > 1
    return v.apply(lambda r: f"{r['detector']}:{r['vocabulary']}" if shared.get(r["vocabulary"], False) else r["vocabulary"], axis=1)


def vocabularies(frame: pd.DataFrame, primary: str) -> View:
    """Tab. 2."""
    title = "Tab. 2 — negative vocabularies x VLMs"
    caption = (
        f"Zero-shot models with negative vocabularies on {primary}, FPR@95 (%). logit-sp.: the best "
        "vocabulary-free (logit-space) scorer. Bold: best deployable vocabulary per row (an 'oracle' vocabulary "
        "is a lower bound, not a detector)."
    )
    f = full_split(frame)
    f = f[(f["dataset"] == primary) & (f["kind"] == "zero-shot")]
    v = f[f["vocabulary"].notna()]
    if len(v) == 0:
        return View("tab2", title, caption, note="omitted: no zero-shot results with a vocabulary (set `vocabulary` on a zeroshot scorer)")
    v = v.assign(col=_vocab_column(v))
    cols = list(dict.fromkeys(v["col"]))
    rows = []
    values: dict[str, list[float]] = {c: [] for c in ["logit-sp."] + cols}
    for m in _models(v):
        logit = _no_vocab(f[f["model"] == m])["fpr95"].min()
        r = {"Model": m, "logit-sp.": pct(logit)}
        values["logit-sp."].append(logit)
        g = v[v["model"] == m].groupby("col")["fpr95"].mean()
        deploy = [c for c in cols if c in g.index and _ORACLE not in c.lower()]
        best = g[deploy].min() if deploy else np.nan
        for c in cols:
            val = g.get(c, np.nan)
            values[c].append(val)
            r[c] = Cell(pct(val), bold=bool(c in deploy and val == best), muted=_ORACLE in c.lower())
        rows.append(r)
    rows.append({"Model": Cell("Mean", bold=True), **{c: pct(np.nanmean(x)) if np.isfinite(x).any() else "–" for c, x in values.items()}})
    return View("tab2", title, caption, pd.DataFrame(rows))


def vocabularies_by_dataset(frame: pd.DataFrame, primary: str) -> View:
    """Tab. A5."""
    title = "Tab. A5 — negative vocabularies on every OOD set"
    caption = "FPR@95 (%) of each vocabulary, mean over the zero-shot models, per OOD set; bold: best deployable vocabulary."
    f = full_split(frame)
    v = f[(f["kind"] == "zero-shot") & f["vocabulary"].notna()]
    if len(v) == 0:
        return View("tabA5", title, caption, note="omitted: no zero-shot results with a vocabulary")
    v = v.assign(col=_vocab_column(v))
    cols = list(dict.fromkeys(v["col"]))
    datasets = [d for d in dict.fromkeys(v["dataset"]) if d != primary] + ([primary] if primary in set(v["dataset"]) else [])
    rows = []
    for d in datasets:
        g = v[v["dataset"] == d].groupby("col")["fpr95"].mean()
        n = v[v["dataset"] == d]["n_ood"].iloc[0]
        deploy = [c for c in cols if c in g.index and _ORACLE not in c.lower()]
        best = g[deploy].min() if deploy else np.nan
        rows.append({"Dataset": d, "n": str(n), **{c: Cell(pct(g.get(c, np.nan)), bold=bool(c in deploy and g.get(c) == best)) for c in cols}})
    return View("tabA5", title, caption, pd.DataFrame(rows))


def split_rows(frame: pd.DataFrame) -> View:
    """Tab. A4: rows of OOD sets that have a split column, with one row per split value."""
    title = "Tab. A4 — fine-grained vs ordinary rows"
    caption = (
        "FPR@95 (%) per detector (columns), mean over the models that ran it, on each OOD set with a split "
        "column and on each of its parts. Bold: best detector per row."
    )
    split_sets = list(dict.fromkeys(frame.loc[frame["split"] != ALL_SPLIT, "dataset"]))
    if not split_sets:
        return View("tabA4", title, caption, note="omitted: no OOD set has a split column (set split_column in the experiment)")
    f = frame[frame["dataset"].isin(split_sets)]
    dets = order_detectors(list(f["det"]))
    rows = []
    for d in split_sets:
        g = f[f["dataset"] == d]
        for split in [ALL_SPLIT] + sorted(set(g["split"]) - {ALL_SPLIT}):
            s = g[g["split"] == split].groupby("det")["fpr95"].mean()
            best = s.min()
            name = d if split == ALL_SPLIT else f"  {split}"
            n = g[g["split"] == split]["n_ood"].iloc[0]
            rows.append({"Dataset / split": name, "n": str(n), **{k: Cell(pct(s.get(k, np.nan)), bold=bool(s.get(k) == best)) for k in dets}})
    return View("tabA4", title, caption, pd.DataFrame(rows))
