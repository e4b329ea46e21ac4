"""The Fi-ImageNet-1k paper's tables from a prepared results frame (:func:`views.prepare`).

Values are percentages (FPR@95 lower is better, AUROC higher is better), means over seeds. A cell
that is one evaluated configuration carries its bootstrap 95% CI in brackets; a mean over models
or OOD sets carries none. The best detector of a cell is named by :func:`views.best_row`.
- Tab. 1: per model the best detector by FPR@95 and, independently, by AUROC on the primary set.
- Tab. A1: every detector x every supervised model, FPR@95 / AUROC; best FPR bold, best AUROC underlined.
- Tab. A2: every OOD set x every model, the best FPR@95 / best AUROC over detectors (chosen
  independently); Mean rows over the other sets (and per near/far group) and the primary set last,
  a Mean column over models.
- Tab. 2 / A5: zero-shot models x negative vocabularies (FPR@95), with the best logit-space detector;
  a vocabulary of several LLM generations (``<vocabulary>-gen<i>``) as mean ± std (ddof=1) over them.
- Split view: fine-grained vs ordinary (split) rows x detectors, mean FPR@95 over models.
Vocabulary-based scorers are kept out of Tabs. 1, A1 and A2 (they are Tab. 2's subject).
FPR@95 is the paper's (ID positive); Tabs. 1 and A1 show OpenOOD's and pytorch-ood's OOD-positive
FPR@95 (``fpr95_ood_positive``) beside it, first with ``convention="openood"`` (docs/detectors.md).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..results import ALL_SPLIT
from .labels import det_cell
from .reference import load_reference
from .views import Cell, View, best_row, full_split, order_detectors, pct, register_view, row_ci, vocabulary_columns

__all__ = ["best_per_model", "detector_by_model", "dataset_by_model", "vocabularies", "vocabularies_by_dataset", "split_rows", "fpr_cell",
           "generations_cell"]

_ORACLE = "oracle"
_OPENOOD = "fpr95_ood_positive"
_OPENOOD_LABEL = "FPR@95 OOD-pos"
_OPENOOD_MEANING = (f" {_OPENOOD_LABEL}: OpenOOD's and pytorch-ood's FPR@95 (OOD positive: ID rejected at 95% OOD recall) "
                    "of the same detector; FPR@95: the paper's (ID positive: OOD accepted at 95% ID recall).")


def _no_vocab(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["vocabulary"].isna()]


def _models(frame: pd.DataFrame, kind: str | None = None) -> list[str]:
    f = frame if kind is None else frame[frame["kind"] == kind]
    return list(dict.fromkeys(f["model"]))



def fpr_cell(rows: pd.DataFrame, metric: str = "fpr95") -> tuple[float, str]:
    """(value, text) of ``rows``: one row gives its value with its CI, several their mean (no CI)."""
    if len(rows) == 0:
        return np.nan, "–"
    if len(rows) == 1:
        return float(rows[metric].iloc[0]), row_ci(rows.iloc[0], metric)
    value = float(rows[metric].mean())
    return value, pct(value)


def _paper_params() -> dict[str, str]:
    """Model name -> parameter count as printed in the paper (Tabs. A7 and 1, both naming schemes)."""
    t1, a7 = load_reference("tab1"), load_reference("tabA7")
    return {**dict(zip(a7["model"], a7["params"])), **dict(zip(t1["model"], t1["params"])), **dict(zip(t1["paper_label"], t1["params"]))}


def _has_ood_positive(f: pd.DataFrame) -> bool:
    return _OPENOOD in f.columns and bool(f[_OPENOOD].notna().any())


@register_view("tab1", order=10, needs=("frame", "primary", "convention"))
def best_per_model(frame: pd.DataFrame, primary: str, convention: str = "paper") -> View:
    """Tab. 1."""
    title = "Tab. 1 — best detector per model"
    caption = (
        f"Post-hoc OOD detection on {primary}. For every model the best detector by FPR@95 (%, lower is better) "
        "and, chosen independently, by AUROC (%, higher is better), each with its bootstrap 95% CI in brackets; "
        "Top-1 is the ID-test accuracy (%); Params from the paper's Tabs. 1 / A7 where the model carries a name of them (else –). "
        "Bold: best column value within each group (supervised / zero-shot)."
    )
    f = _no_vocab(full_split(frame))
    f = f[f["dataset"] == primary]
    if len(f) == 0:
        return View("tab1", title, caption, note=f"omitted: no results on {primary}")
    openood = _has_ood_positive(f)
    params = _paper_params()
    rows = []
    for kind in ("supervised", "zero-shot"):
        g = f[f["kind"] == kind]
        if len(g) == 0:
            continue
        picks = {m: (best_row(gm, "fpr95"), best_row(gm, "auroc")) for m, gm in g.groupby("model", sort=False)}
        top1 = g.groupby("model", sort=False)["id_accuracy"].mean()
        lo_fpr = min(p[0]["fpr95"] for p in picks.values())
        hi_auc = max(p[1]["auroc"] for p in picks.values())
        hi_acc = top1.max()
        for m, (r, a) in picks.items():
            acc = top1[m]
            row = {
                "Group": kind,
                "Model": m,
                "Params": params.get(m, "–"),
                "Top-1": Cell(pct(acc), bold=bool(np.isfinite(acc) and acc == hi_acc)),
            }
            if openood and convention == "openood":
                row[_OPENOOD_LABEL] = row_ci(r, _OPENOOD)
            row.update({"FPR@95": Cell(row_ci(r, "fpr95"), bold=bool(r["fpr95"] == lo_fpr)), "FPR detector": det_cell(r["det"])})
            if openood and convention != "openood":
                row[_OPENOOD_LABEL] = row_ci(r, _OPENOOD)
            row.update({"AUROC": Cell(row_ci(a, "auroc"), bold=bool(a["auroc"] == hi_auc)), "AUROC detector": det_cell(a["det"])})
            rows.append(row)
    if openood:
        caption += _OPENOOD_MEANING + " The FPR detector is the one with the best paper FPR@95."
    return View("tab1", title, caption, pd.DataFrame(rows))


@register_view("tabA1", order=40, needs=("frame", "primary", "convention"))
def detector_by_model(frame: pd.DataFrame, primary: str, convention: str = "paper") -> View:
    """Tab. A1."""
    title = "Tab. A1 — every detector x every model"
    caption = (
        f"All post-hoc detectors on {primary}, FPR@95 (%) / AUROC (%), each with its bootstrap 95% CI. Per model the "
        "best FPR@95 is bold and the best AUROC underlined."
    )
    f = _no_vocab(full_split(frame))
    f = f[(f["dataset"] == primary) & (f["kind"] == "supervised")]
    if len(f) == 0:
        return View("tabA1", title, caption, note=f"omitted: no supervised-model results on {primary}")
    openood = _has_ood_positive(f)
    if openood:
        order = "FPR@95 OOD-pos / FPR@95 / AUROC" if convention == "openood" else "FPR@95 / AUROC / FPR@95 OOD-pos"
        caption += f" With both conventions each cell reads {order}." + _OPENOOD_MEANING
    models = _models(f)
    dets = order_detectors(list(f["det"]))
    table = {d: {"Detector": det_cell(d)} for d in dets}
    for m in models:
        g = f[f["model"] == m].set_index("det")
        lo, hi = g["fpr95"].min(), g["auroc"].max()
        for d in dets:
            if d not in g.index:
                table[d][m] = Cell("–", muted=True)
                continue
            r = g.loc[d]
            parts = [row_ci(r, "fpr95"), row_ci(r, "auroc")]
            if openood:
                parts.insert(0 if convention == "openood" else 2, row_ci(r, _OPENOOD))
            text = " / ".join(parts)
            table[d][m] = Cell(text, bold=bool(r["fpr95"] == lo), underline=bool(r["auroc"] == hi))
    return View("tabA1", title, caption, pd.DataFrame(list(table.values())))


def _best_cells(f: pd.DataFrame) -> pd.DataFrame:
    """Per (dataset, model): the best FPR@95 and, independently, the best AUROC, with their CIs."""
    out = []
    for (d, m), g in f.groupby(["dataset", "model"], sort=False):
        r, a = best_row(g, "fpr95"), best_row(g, "auroc")
        out.append({"dataset": d, "model": m, "fpr95": r["fpr95"], "auroc": a["auroc"], "text": f"{row_ci(r, 'fpr95')} / {row_ci(a, 'auroc')}"})
    return pd.DataFrame(out)


@register_view("tabA2", order=50, needs=("frame", "primary", "groups"))
def dataset_by_model(frame: pd.DataFrame, primary: str, groups: dict[str, str] | None = None) -> View:
    """Tab. A2; ``groups`` maps OOD set -> group (e.g. near / far) for one Mean row per group."""
    title = "Tab. A2 — every OOD set x every model"
    caption = (
        "Best FPR@95 (%) / best AUROC (%) over the detectors, per model (supervised ones when there are any) and OOD set, the two metrics "
        f"selected independently, each with its bootstrap 95% CI. Mean: over the OOD sets above it (Mean (group): over that group's sets "
        f"above it, no CI); {primary} (the primary set) last, in no mean, as in the paper (the OOD groups table averages every set of a group)."
    )
    f = _no_vocab(full_split(frame))
    if (f["kind"] == "supervised").any():
        f = f[f["kind"] == "supervised"]
    if len(f) == 0:
        return View("tabA2", title, caption, note="omitted: no results")
    models = _models(f)
    best = _best_cells(f)
    datasets = [d for d in dict.fromkeys(f["dataset"]) if d != primary]
    rows = []

    def row(name: str, sub: pd.DataFrame, bold: bool = False, single: bool = True) -> dict:
        r = {"Dataset": Cell(name, bold=bold)}
        for m in models:
            s = sub[sub["model"] == m]
            if len(s) == 0:
                r[m] = Cell("–", muted=True)
            else:
                r[m] = s["text"].iloc[0] if single else f"{pct(s['fpr95'].mean())} / {pct(s['auroc'].mean())}"
        by_model = sub.groupby("model")[["fpr95", "auroc"]].mean()
        r["Mean"] = f"{pct(by_model['fpr95'].mean())} / {pct(by_model['auroc'].mean())}" if len(by_model) else "–"
        return r

    for d in datasets:
        rows.append(row(d, best[best["dataset"] == d]))
    for name, members in _group_means(datasets, groups):
        rows.append(row(name, best[best["dataset"].isin(members)], bold=True, single=False))
    if primary in set(best["dataset"]):
        rows.append(row(primary, best[best["dataset"] == primary]))
    return View("tabA2", title, caption, pd.DataFrame(rows))


def generations_cell(rows: pd.DataFrame, metric: str = "fpr95") -> tuple[float, str]:
    """(value, text) of one vocabulary column's ``rows``, which may hold several LLM generations of
    the vocabulary (column ``gen``, :func:`oodeval.experiment.zeroshot.vocabulary_generation`): per
    generation the mean over the rows (models), then the mean over generations ± their standard
    deviation (ddof=1) and the number of generations, ``"70.2 ± 7.8 (30 gen.)"``, as the paper's
    Tab. 2 / A4; without generations :func:`fpr_cell`."""
    gens = rows["gen"].dropna() if "gen" in rows else pd.Series(dtype=float)
    if gens.nunique() < 2:
        return fpr_cell(rows, metric)
    per_gen = rows.groupby("gen")[metric].mean()
    mean = float(per_gen.mean())
    return mean, f"{pct(mean)} ± {100 * per_gen.std(ddof=1):.1f} ({len(per_gen)} gen.)"


def _vocab_cells(rows: pd.DataFrame, cols: list[str]) -> dict[str, Cell]:
    """One cell per vocabulary column of ``rows`` (:func:`generations_cell`); bold the best deployable
    one, mute the oracle (a lower bound, not a detector)."""
    cells = {c: generations_cell(rows[rows["col"] == c]) for c in cols}
    deploy = [c for c in cols if np.isfinite(cells[c][0]) and _ORACLE not in c.lower()]
    best = min(cells[c][0] for c in deploy) if deploy else np.nan
    return {c: Cell(text, bold=bool(c in deploy and val == best), muted=_ORACLE in c.lower()) for c, (val, text) in cells.items()}


def _scorer_heads(cols: list[str]) -> dict:
    """Vocabulary columns that name their scorer (``neglabel:wordnet``, :func:`vocabulary_columns`)
    headed by the scorer's label (``NegLabel:wordnet``)."""
    return {c: det_cell(c) for c in cols if ":" in c}


@register_view("tab2", order=20, needs=("frame", "primary"))
def vocabularies(frame: pd.DataFrame, primary: str) -> View:
    """Tab. 2."""
    title = "Tab. 2 — negative vocabularies x VLMs"
    caption = (
        f"Zero-shot models with negative vocabularies on {primary}, FPR@95 (%) with bootstrap 95% CIs (the Mean row has none). logit-sp.: the best "
        "vocabulary-free (logit-space) scorer. A vocabulary of several LLM generations (files '<vocabulary>-gen<i>') shows the mean over its "
        "generations ± their standard deviation (ddof=1) and their number; its Mean row: per generation the mean over the models, then "
        "mean ± std over generations (the paper's EOE: 30 generations, std 7.8 on the mean, Tab. A4; GPT: 10, std 1.0-1.5 per model, App. B). "
        "Bold: best deployable vocabulary per row (an 'oracle' vocabulary is a lower bound, not a detector)."
    )
    f = full_split(frame)
    f = f[(f["dataset"] == primary) & (f["kind"] == "zero-shot")]
    v = f[f["vocabulary"].notna()]
    if len(v) == 0:
        return View("tab2", title, caption, note="omitted: no zero-shot results with a vocabulary (set `vocabulary` on a zeroshot scorer)")
    adaptive = sorted(v.loc[v["streams"] > 0, "detector"].unique()) if "streams" in v else []
    if adaptive:
        caption += (f" Test-time scorers ({', '.join(adaptive)}) saw the test set adaptively: one stream of the ID test set and "
                    "each OOD set per seed, the seed being the stream order (settings in the results' `stream` column); their "
                    "cells are means over the orders. The other scorers are static.")
    v = vocabulary_columns(v)
    cols = list(dict.fromkeys(v["col"]))
    rows = []
    logits: list[float] = []
    for m in _models(v):
        lf = _no_vocab(f[f["model"] == m])
        logit = best_row(lf, "fpr95") if len(lf) else None
        r = {"Model": m, "logit-sp.": "–" if logit is None else row_ci(logit, "fpr95")}
        logits.append(np.nan if logit is None else logit["fpr95"])
        rows.append({**r, **_vocab_cells(v[v["model"] == m], cols)})
    mean = {"logit-sp.": pct(np.nanmean(logits)) if np.isfinite(logits).any() else "–"}
    for c in cols:
        g = v[v["col"] == c]
        per_model = g.groupby("model")["fpr95"].mean()  # a model's mean over its generations
        mean[c] = generations_cell(g)[1] if g["gen"].nunique() > 1 else pct(per_model.mean())
    rows.append({"Model": Cell("Mean", bold=True), **mean})
    return View("tab2", title, caption, pd.DataFrame(rows).rename(columns=_scorer_heads(cols)))


def _group_means(datasets: list[str], groups: dict[str, str] | None) -> list[tuple[str, list[str]]]:
    """("Mean", every set) when there are several, then ("Mean (<group>)", its sets) per group."""
    out = [("Mean", datasets)] if len(datasets) > 1 else []
    for group in dict.fromkeys((groups or {}).values()):
        members = [d for d in datasets if (groups or {}).get(d) == group]
        if members:
            out.append((f"Mean ({group})", members))
    return out


@register_view("tabA5", order=80, needs=("frame", "primary", "groups"))
def vocabularies_by_dataset(frame: pd.DataFrame, primary: str, groups: dict[str, str] | None = None) -> View:
    """Tab. A5; ``groups`` as in :func:`dataset_by_model`."""
    title = "Tab. A5 — negative vocabularies on every OOD set"
    caption = (
        "FPR@95 (%) of each vocabulary, mean over the zero-shot models (one model: its value with its bootstrap 95% CI), "
        f"per OOD set; bold: best deployable vocabulary. Mean rows (no CI): over the OOD sets (or a group's) other than {primary}, "
        "each vocabulary over the sets it was run on."
    )
    f = full_split(frame)
    v = f[(f["kind"] == "zero-shot") & f["vocabulary"].notna()]
    if len(v) == 0:
        return View("tabA5", title, caption, note="omitted: no zero-shot results with a vocabulary")
    v = vocabulary_columns(v)
    cols = list(dict.fromkeys(v["col"]))
    others = [d for d in dict.fromkeys(v["dataset"]) if d != primary]

    def row(d: str) -> dict:
        vd = v[v["dataset"] == d]
        return {"Dataset": d, "n": str(vd["n_ood"].iloc[0]), **_vocab_cells(vd, cols)}

    rows = [row(d) for d in others]
    for name, members in _group_means(others, groups):
        per = v[v["dataset"].isin(members)].groupby(["col", "dataset"])["fpr95"].mean().groupby("col").mean()
        rows.append({"Dataset": Cell(name, bold=True), "n": "", **{c: pct(per.get(c, np.nan)) for c in cols}})
    if primary in set(v["dataset"]):
        rows.append(row(primary))
    return View("tabA5", title, caption, pd.DataFrame(rows).rename(columns=_scorer_heads(cols)))


@register_view("splits", order=110)
def split_rows(frame: pd.DataFrame) -> View:
    """The split view: rows of OOD sets that have a split column, with one row per split value."""
    title = "Split view — fine-grained vs ordinary rows"
    caption = (
        "FPR@95 (%) per detector (columns), mean over the models that ran it (one model: its value with its bootstrap "
        "95% CI), on each OOD set with a split column and on each of its parts. Bold: best detector per row."
    )
    split_sets = list(dict.fromkeys(frame.loc[frame["split"] != ALL_SPLIT, "dataset"]))
    if not split_sets:
        return View("splits", title, caption, note="omitted: no OOD set has a split column (set split_column in the experiment)")
    f = frame[frame["dataset"].isin(split_sets)]
    dets = order_detectors(list(f["det"]))
    rows = []
    for d in split_sets:
        g = f[f["dataset"] == d]
        for split in [ALL_SPLIT] + sorted(set(g["split"]) - {ALL_SPLIT}):
            gs = g[g["split"] == split]
            cells = {k: fpr_cell(gs[gs["det"] == k]) for k in dets}
            best = np.nanmin([c[0] for c in cells.values()])
            name = d if split == ALL_SPLIT else f"  {split}"
            rows.append({"Dataset / split": name, "n": str(gs["n_ood"].iloc[0]), **{det_cell(k): Cell(c[1], bold=bool(c[0] == best)) for k, c in cells.items()}})
    return View("splits", title, caption, pd.DataFrame(rows))
