"""The paper's remaining views: Tab. 3, Tab. A3, Tab. A4 (EOE prompts), Tab. A7, and the data of
Fig. A3 and Fig. 2 / A5.

- Tab. 3: the figure model (the paper's: the best Top-1, EVA02-L-448) on every OOD set at full
  size, best FPR@95 and best AUROC over its detectors (named), the primary set last.
- Tab. A3: each OOD set beside its NINCO-cleaned sub-sample, an OOD set labelled ``"<set> (clean)"``
  (as in ``examples/fi-imagenet-1k.toml``), same model and metrics, with n, the sub-sample's share and
  the change in FPR@95.
- Tab. A4: EOE with each prompt (vocabulary ``<prompt>`` or ``<prompt>-gen<i>`` for repeated LLM
  generations) per OOD set: FPR@95 averaged over the VLMs per generation, then mean ± std (ddof=1)
  over generations; MCM beside it; bold the best prompt per row, underlined where it does not beat MCM.
- Tab. A7: every supervised model with its pre-training data and size (from the paper's Tab. A7
  where the model carries one of its names), Top-1, best FPR@95 and AUROC on the primary set.
- Fig. A3: vocabulary sweeps named ``merged...`` (k negatives per ID class from the merged pool),
  mean over models, one line per OOD set (the primary solid, the others dashed).
- Fig. 2 / A5: certified OOD images of a construction export (``ood.csv``) with their verified
  (green) and original (red) labels.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import InputError
from ..experiment.zeroshot import vocabulary_generation
from .labels import det_cell
from .reference import load_reference
from .views import Cell, View, best_row, full_split, pct, register_view, row_ci

__all__ = ["benchmarks", "clean_subsamples", "eoe_prompts", "supervised_models", "gallery_items", "CLEAN_SUFFIX"]

CLEAN_SUFFIX = " (clean)"



def _supervised(frame: pd.DataFrame) -> pd.DataFrame:
    f = full_split(frame)
    return f[f["vocabulary"].isna() & (f["kind"] == "supervised")]


def _best_pair(g: pd.DataFrame) -> dict:
    r, a = best_row(g, "fpr95"), best_row(g, "auroc")
    return {"FPR@95": row_ci(r, "fpr95"), "FPR detector": det_cell(r["det"]), "AUROC": row_ci(a, "auroc"), "AUROC detector": det_cell(a["det"])}


@register_view("tab3", order=30, needs=("frame", "primary", "model"))
def benchmarks(frame: pd.DataFrame, primary: str, model: str | None) -> View:
    """Tab. 3."""
    title = "Tab. 3 — the primary set against the other OOD benchmarks"
    caption = (
        f"{model}: FPR@95 (%) and AUROC (%) with bootstrap 95% CIs, the best of its detectors per OOD set (named); n: OOD images. "
        f"Full-size sets first, {primary} (the primary set) last; NINCO-cleaned sub-samples are in Tab. A3."
    )
    f = _supervised(frame)
    f = f[(f["model"] == model) & ~f["dataset"].str.endswith(CLEAN_SUFFIX)]
    if len(f) == 0:
        return View("tab3", title, caption, note="omitted: no supervised-model results")
    datasets = [d for d in dict.fromkeys(f["dataset"]) if d != primary] + ([primary] if primary in set(f["dataset"]) else [])
    rows = [{"Dataset": d, "n": str(f[f["dataset"] == d]["n_ood"].iloc[0]), **_best_pair(f[f["dataset"] == d])} for d in datasets]
    return View("tab3", title, caption, pd.DataFrame(rows))


@register_view("tabA3", order=60, needs=("frame", "model"))
def clean_subsamples(frame: pd.DataFrame, model: str | None) -> View:
    """Tab. A3."""
    title = "Tab. A3 — popular OOD sets at full size and as NINCO-cleaned sub-samples"
    caption = (
        f"{model}: best FPR@95 / AUROC (%, bootstrap 95% CIs) over its detectors on each OOD set and on its cleaned sub-sample "
        f"(an OOD set labelled '<set>{CLEAN_SUFFIX}'); %: the sub-sample's size as a share of the full set; ΔFPR: clean - full."
    )
    f = _supervised(frame)
    f = f[f["model"] == model]
    pairs = [(d[: -len(CLEAN_SUFFIX)], d) for d in dict.fromkeys(f["dataset"]) if d.endswith(CLEAN_SUFFIX) and d[: -len(CLEAN_SUFFIX)] in set(f["dataset"])]
    if not pairs:
        return View("tabA3", title, caption, note=f"omitted: no OOD set has a cleaned sub-sample labelled '<set>{CLEAN_SUFFIX}' in the results")
    rows = []
    for full, clean in pairs:
        g, c = f[f["dataset"] == full], f[f["dataset"] == clean]
        n, m = int(g["n_ood"].iloc[0]), int(c["n_ood"].iloc[0])
        bf, bc = best_row(g), best_row(c)
        rows.append({
            "Dataset": full, "n": str(n), "FPR@95": row_ci(bf, "fpr95"), "detector": det_cell(bf["det"]), "AUROC": row_ci(best_row(g, "auroc"), "auroc"),
            "n clean": str(m), "%": f"{100 * m / n:.1f}", "FPR@95 clean": row_ci(bc, "fpr95"), "detector clean": det_cell(bc["det"]),
            "AUROC clean": row_ci(best_row(c, "auroc"), "auroc"), "ΔFPR": f"{100 * (bc['fpr95'] - bf['fpr95']):+.1f}",
        })  # fmt: skip
    return View("tabA3", title, caption, pd.DataFrame(rows))


def _prompt_and_generation(vocabulary: str) -> tuple[str, str]:
    prompt, gen = vocabulary_generation(vocabulary)
    return prompt, str(0 if gen is None else gen)


@register_view("tabA4", order=70)
def eoe_prompts(frame: pd.DataFrame) -> View:
    """Tab. A4 (the paper's: EOE's prompts x OOD sets)."""
    title = "Tab. A4 — EOE's prompts across OOD sets"
    caption = (
        "FPR@95 (%) of EOE with each prompt's vocabulary (columns; repeated LLM generations named '<prompt>-gen<i>'): the mean over "
        "the zero-shot models per generation, then the mean ± std (ddof=1) over generations; one generation and one model: its "
        "bootstrap 95% CI. MCM: the vocabulary-free baseline. Bold: best prompt per row, underlined when it does not beat MCM."
    )
    f = full_split(frame)
    f = f[f["kind"] == "zero-shot"]
    eoe = f[(f["detector"] == "eoe") & f["vocabulary"].notna()]
    if len(eoe) == 0:
        return View("tabA4", title, caption, note="omitted: no EOE results with a vocabulary (add eoe scorers with one vocabulary per prompt)")
    pg = [_prompt_and_generation(str(v)) for v in eoe["vocabulary"]]
    eoe = eoe.assign(prompt=[p for p, _ in pg], gen=[g for _, g in pg])
    prompts = list(dict.fromkeys(eoe["prompt"]))
    mcm = f[(f["detector"] == "mcm") & f["vocabulary"].isna()]
    rows = []
    for d in dict.fromkeys(eoe["dataset"]):
        e = eoe[eoe["dataset"] == d]
        base = mcm[mcm["dataset"] == d]["fpr95"].mean()
        cells: dict[str, tuple[float, str]] = {}
        for p in prompts:
            g = e[e["prompt"] == p]
            if len(g) == 0:
                cells[p] = (np.nan, "–")
            elif len(g) == 1:
                cells[p] = (float(g["fpr95"].iloc[0]), row_ci(g.iloc[0], "fpr95"))
            else:
                per_gen = g.groupby("gen")["fpr95"].mean()
                std = f" ± {100 * per_gen.std(ddof=1):.1f}" if len(per_gen) > 1 else ""
                cells[p] = (float(per_gen.mean()), pct(per_gen.mean()) + std)
        best = np.nanmin([v for v, _ in cells.values()])
        row = {"Dataset": d, "MCM": pct(base)}
        for p, (v, text) in cells.items():
            win = bool(v == best)
            beats = not np.isfinite(base) or v < base
            row[p] = Cell(text, bold=win and beats, underline=win and not beats)
        rows.append(row)
    return View("tabA4", title, caption, pd.DataFrame(rows))


@register_view("tabA7", order=100, needs=("frame", "primary"))
def supervised_models(frame: pd.DataFrame, primary: str) -> View:
    """Tab. A7."""
    title = "Tab. A7 — every supervised model"
    caption = (
        f"Best FPR@95 and AUROC (%, bootstrap 95% CIs) over each supervised model's detectors on {primary} (detector named); "
        "Top-1: ID-test accuracy. Pre-training and Params from the paper's Tab. A7 where the model carries its name there (else –). "
        "Sorted by FPR@95, worst first, as in the paper."
    )
    f = _supervised(frame)
    f = f[f["dataset"] == primary]
    if len(f) == 0:
        return View("tabA7", title, caption, note=f"omitted: no supervised-model results on {primary}")
    ref = load_reference("tabA7").set_index("model")
    rows = []
    for m, g in f.groupby("model", sort=False):
        r, a = best_row(g, "fpr95"), best_row(g, "auroc")
        known = m in ref.index
        rows.append({
            "Model": m, "Pre-training": ref.loc[m, "pretraining"] if known else "–", "Params": ref.loc[m, "params"] if known else "–",
            "Top-1": pct(g["id_accuracy"].mean()), "FPR@95": row_ci(r, "fpr95"), "FPR detector": det_cell(r["det"]),
            "AUROC": row_ci(a, "auroc"), "AUROC detector": det_cell(a["det"]), "_fpr": r["fpr95"],
        })  # fmt: skip
    table = pd.DataFrame(rows).sort_values("_fpr", ascending=False, kind="stable").drop(columns="_fpr")
    return View("tabA7", title, caption, table.reset_index(drop=True))


def gallery_items(export: str | Path | None, count: int, skip: int = 0, seed: int = 0) -> list[tuple[Path, str, str]]:
    """(image path, verified OOD label, original label) of ``count`` certified OOD images of a
    construction export folder (its ``ood.csv``), in a seeded random order after the first ``skip``."""
    if export is None:
        return []
    table = Path(export) / "ood.csv"
    if not table.is_file():
        raise FileNotFoundError(f"construction export {export} has no ood.csv (oodeval construct export writes it)")
    ood = pd.read_csv(table)
    missing = [c for c in ("path", "ood_label", "original_name") if c not in ood.columns]
    if missing:
        raise InputError(f"{table} lacks column(s) {', '.join(missing)}")
    order = np.random.default_rng(seed).permutation(len(ood))[skip : skip + count]
    return [(Path(export) / ood["path"].iloc[i], str(ood["ood_label"].iloc[i]), str(ood["original_name"].iloc[i])) for i in order]
