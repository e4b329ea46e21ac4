"""The Fi-ImageNet-1k paper's published numbers (package data) and the view that sets a report's
cells beside them.

``reference/<table>.csv`` transcribes Tabs. 1, 2, 3, A1, A2, A4, A5 and A7 of the paper (values in %,
detectors by registry name). Models are named as in Tab. A7 / A8 and in ``examples/fi-imagenet-1k.toml``:
where Tabs. 1, A1 and A2 print a shorter name for an ImageNet-21k checkpoint (ViT-B/16-384,
SwinV2-B-256, ConvNeXt-B), ``paper_label`` keeps the printed one. A reproduced cell is flagged when
the paper's value lies outside the cell's bootstrap 95% CI widened by the paper's rounding (0.05 points).
"""

from __future__ import annotations

from importlib import resources

import numpy as np
import pandas as pd

from ..errors import InputError
from .labels import det_cell, detector_label
from .views import Cell, View, best_row, full_split, register_view, row_ci, vocabulary_columns

__all__ = ["TABLES", "load_reference", "comparison_view"]

TABLES = ("tab1", "tab2", "tab3", "tabA1", "tabA2", "tabA4", "tabA5", "tabA7")
_ROUNDING = 0.05  # the paper prints one decimal (points)


def load_reference(table: str) -> pd.DataFrame:
    """The paper's ``table`` (one of :data:`TABLES`) as a DataFrame, values in %."""
    if table not in TABLES:
        raise InputError(f"no reference table {table!r}; there are: {', '.join(TABLES)}")
    with resources.files(__package__).joinpath("reference", f"{table}.csv").open() as f:
        return pd.read_csv(f, keep_default_na=False, na_values=[""])


def _generations_mean(rows: pd.DataFrame, metric: str = "fpr95") -> pd.Series:
    """The mean over the LLM generations in ``rows`` (one per generation) with a normal 95% CI of
    that mean, mean ± 1.96 std / sqrt(n) (std with ddof=1), and its text."""
    per_gen = rows.groupby("gen")[metric].mean()
    mean, std, n = float(per_gen.mean()), float(per_gen.std(ddof=1)), len(per_gen)
    half = 1.96 * std / np.sqrt(n)
    return pd.Series({metric: mean, f"{metric}_lo": mean - half, f"{metric}_hi": mean + half, "std": std, "n_gen": n})


def _best(det: str, paper: str | None = None) -> Cell:
    """"best: rMaha++ (paper: Maha++)", the registry names as the tooltip."""
    names = f"best: {det}" + (f" (paper: {paper})" if paper else "")
    return Cell(f"best: {detector_label(det)}" + (f" (paper: {detector_label(paper)})" if paper else ""), title=names)


def _entry(table: str, row: pd.Series, metric: str, ours: pd.Series | None, paper: float, what: str | Cell) -> dict | None:
    if ours is None or not np.isfinite(paper):
        return None
    value, lo, hi = (100 * float(ours.get(k, np.nan)) for k in (metric, f"{metric}_lo", f"{metric}_hi"))
    if np.isfinite(lo) and np.isfinite(hi):
        flag = "outside CI" if not (lo - _ROUNDING <= paper <= hi + _ROUNDING) else ""
    else:
        flag = "no CI"
    text, paper_text = row_ci(ours, metric), f"{paper:.1f}"
    if "n_gen" in ours:  # a mean over LLM generations, beside the paper's
        text += f", ± {100 * ours['std']:.1f} over {int(ours['n_gen'])} gen."
        gens, std = row.get("generations"), row.get("std_over_generations")
        if pd.notna(gens):
            paper_text += (f" ± {std:.1f}" if pd.notna(std) else "") + f" over {int(gens)} gen."
    return {
        "Table": table, "Model": row["model"], "OOD set": row["dataset"], "Detector": what,
        "Metric": {"fpr95": "FPR@95", "auroc": "AUROC"}[metric],
        "Ours [95% CI]": text,
        "Paper": paper_text, "Δ": f"{value - paper:+.1f}", "Flag": flag,
    }  # fmt: skip


@register_view("paper", order=130)
def comparison_view(frame: pd.DataFrame) -> View:
    """Every cell of Tabs. 1, 2, 3, A1, A2, A5 and A7 that the results reproduce, beside the paper's value."""
    title = "Paper comparison — reproduced cells beside the published ones"
    f = full_split(frame)
    logit = f[f["vocabulary"].isna()]
    out: list[dict | None] = []
    models, datasets = set(f["model"]), set(f["dataset"])

    def reference(name: str) -> pd.DataFrame:
        """The rows of a reference table whose model (or, for Tab. A5, OOD set) the results hold."""
        ref = load_reference(name)
        return ref[ref["dataset"].isin(datasets)] if name == "tabA5" else ref[ref["model"].isin(models)]

    def cells(model: str, dataset: str, kind: str | None = None) -> pd.DataFrame:
        g = logit[(logit["model"] == model) & (logit["dataset"] == dataset)]
        return g if kind is None else g[g["kind"] == kind]

    for name in ("tab1", "tabA7"):
        for _, r in reference(name).iterrows():
            r = r.copy()
            r["dataset"] = "Fi-ImageNet-1k"
            g = cells(r["model"], r["dataset"], r.get("kind") if isinstance(r.get("kind"), str) else None)
            if len(g):
                for metric in ("fpr95", "auroc"):
                    b = best_row(g, metric)
                    out.append(_entry(name, r, metric, b, float(r[metric]), _best(b["det"], r[metric + "_detector"])))
    for name in ("tabA2", "tab3"):
        for _, r in reference(name).iterrows():
            g = cells(r["model"], r["dataset"], "supervised")
            if len(g):
                for metric in ("fpr95", "auroc"):
                    b = best_row(g, metric)
                    out.append(_entry(name, r, metric, b, float(r[metric]), _best(b["det"])))
    for _, r in reference("tabA1").iterrows():
        g = cells(r["model"], r["dataset"])
        g = g[g["det"] == r["detector"]]
        for metric in ("fpr95", "auroc"):
            out.append(_entry("tabA1", r, metric, g.iloc[0] if len(g) == 1 else None, float(r[metric]), det_cell(r["detector"])))
    vocab = vocabulary_columns(f)
    for _, r in reference("tab2").iterrows():
        if r["vocabulary"] == "logit-sp.":
            g = cells(r["model"], r["dataset"], "zero-shot")
            b = best_row(g) if len(g) else None
        else:
            g = vocab[(vocab["model"] == r["model"]) & (vocab["dataset"] == r["dataset"]) & (vocab["col"] == r["vocabulary"])]
            b = _generations_mean(g) if g["gen"].nunique() > 1 else g.iloc[0] if len(g) == 1 else None
        out.append(_entry("tab2", r, "fpr95", b, float(r["fpr95"]), r["vocabulary"]))
    zs = vocab[vocab["kind"] == "zero-shot"]
    for _, r in reference("tabA5").iterrows():
        g = zs[(zs["dataset"] == r["dataset"]) & (zs["col"] == r["vocabulary"])]
        if len(g):
            mean = pd.Series({"fpr95": g["fpr95"].mean()}) if len(g) > 1 else g.iloc[0]
            r = r.copy()
            r["model"] = f"mean of {g['model'].nunique()} VLM(s)"
            out.append(_entry("tabA5", r, "fpr95", mean, float(r["fpr95"]), r["vocabulary"]))
    rows = [e for e in out if e is not None]
    flagged = sum(e["Flag"] == "outside CI" for e in rows)
    caption = (
        "Each reproduced cell (%, its bootstrap 95% CI in brackets) beside the paper's published value; Δ = ours - paper. "
        f"Flag 'outside CI': the paper's value lies outside the CI widened by the paper's rounding ({_ROUNDING} points); "
        f"{flagged} of {len(rows)} compared cells are flagged. Best-of cells (Tabs. 1, 3, A2, A7) compare the best over our detectors. "
        "A Tab. 2 vocabulary of several LLM generations compares the mean over our generations (CI: mean ± 1.96 std / sqrt(n), "
        "std with ddof=1, ± std beside it) with the paper's mean over its generations (EOE 30, GPT 10)."
    )
    if not rows:
        return View("paper", title, caption, note="omitted: no cell of the paper's tables in the results (models, OOD sets and detectors named as in examples/fi-imagenet-1k.toml)")
    return View("paper", title, caption, pd.DataFrame(rows))
