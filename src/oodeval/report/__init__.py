"""Reports of a results table: the Fi-ImageNet-1k paper's tables and figures and the CnC summary,
as Markdown, LaTeX and one self-contained HTML page (``write_report``).

Views without data are omitted with a note saying why, never filled with placeholders.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .._io import claim_folder, remove_own, write_text_atomic
from ..errors import InputError
from ..experiment.config import load_config
from ..metrics import fpr_ood_positive
from ..results import ALL_SPLIT, METRICS, load_cell_scores, load_results, missing_cell_scores, parts_dir
from ..zeroshot.sweeps import save_sweep, sweeps_path
from . import cnc, groups, ranks, reference, tables  # noqa: F401 - they register their views
from . import figures as figs
from .paper_views import CLEAN_SUFFIX, gallery_items
from .render import html_page, latex, markdown
from .selection import select_configurations
from .summary import run_summary
from .subsampling import default_subsample_n, model_scores, subsampling_curves
from .views import VIEWS, Figure, View, add_det, best_row, full_split, prepare, register_view

__all__ = ["write_report", "build_views", "register_view", "VIEWS", "sweeps_path", "save_sweep", "CONVENTIONS"]

#: which FPR@95 leads (``oodeval.metrics.FPR95_CONVENTIONS``): ``paper`` (ID positive) or ``openood``
#: (OOD positive, OpenOOD v1.5 and pytorch-ood); the other is shown beside it
CONVENTIONS = ("paper", "openood")

def _check_values(df: pd.DataFrame, results: Path) -> None:
    """Refuse a table holding a metric outside [0, 1] (every metric is a fraction): it is not one oodeval computed."""
    for m in [c for c in df.columns if c in METRICS or (c.endswith(("_lo", "_hi")) and c[:-3] in METRICS)]:
        v = pd.to_numeric(df[m], errors="coerce")
        bad = v.notna() & ((v < 0) | (v > 1))
        if bad.any():
            r = df[bad].iloc[0]
            raise InputError(f"results table {results}: {int(bad.sum())} value(s) of {m} lie outside [0, 1] "
                             f"(e.g. {float(v[bad].iloc[0])!r} for {r['detector']}/{r['dataset']}); metrics are fractions, "
                             "so the table was changed outside oodeval: recompute it with `oodeval run`")


def _pick_model(frame: pd.DataFrame) -> str | None:
    """The paper's model of Tab. 3, A3, A6 and Fig. 1, A4: the supervised model with the best ID-test
    Top-1 (EVA02-L-448); without accuracies, the one with the lowest mean best FPR@95."""
    f = full_split(frame)
    f = f[f["vocabulary"].isna()]
    if len(f) == 0:
        return None
    sup = f[f["kind"] == "supervised"]
    f = sup if len(sup) else f
    acc = f.groupby("model", sort=False)["id_accuracy"].mean()
    if acc.notna().any():
        return str(acc.idxmax())
    best = f.groupby(["model", "dataset"], sort=False)["fpr95"].min().groupby("model", sort=False).mean()
    return str(best.idxmin())


def _with_ood_positive(df: pd.DataFrame, results_path: Path) -> pd.DataFrame:
    """``df`` with ``fpr95_ood_positive`` filled where an ok row lacks it (a table written before the
    column existed): ``metrics.fpr_ood_positive`` of its stored scores, without CI; NaN without scores."""
    missing = (df["status"] == "ok") & df["fpr95_ood_positive"].isna()
    if not missing.any():
        return df
    df = df.copy()
    for i, r in df[missing].iterrows():
        try:
            df.loc[i, "fpr95_ood_positive"] = fpr_ood_positive(*load_cell_scores(r, results_path))
        except (OSError, ValueError):
            pass
    return df


def build_views(
    df: pd.DataFrame,
    results_path: Path,
    *,
    primary: str | None = None,
    model: str | None = None,
    subsample_n: int | None = None,
    draws: int = 1000,
    seed: int = 0,
    groups: dict[str, str] | None = None,
    convention: str = "paper",
) -> tuple[list[View], dict]:
    """Every registered table view (:data:`VIEWS`, in order; :func:`register_view`), and the
    choices made (primary set, model, n) for the figures; ``convention``: the FPR@95 that leads.

    ``groups`` maps OOD set -> group name (near / far ...) for Tab. A2's group means."""
    frame = prepare(df)
    datasets = list(dict.fromkeys(full_split(frame)["dataset"]))
    if primary is None and datasets:
        primary = datasets[0]
    if primary is not None and datasets and primary not in datasets:
        raise InputError(f"primary OOD set {primary!r} is not in the results; they hold: {', '.join(datasets)}")
    models = list(dict.fromkeys(frame["model"]))
    if model is not None and model not in models:
        raise InputError(f"model {model!r} is not in the results; they hold: {', '.join(models)}")
    model = model or _pick_model(frame)
    scores = model_scores(df, results_path, model) if model else {}
    inputs = {"frame": frame, "primary": primary or "", "model": model, "groups": groups, "results": df, "scores": scores,
              "subsample_n": subsample_n, "draws": draws, "seed": seed, "convention": convention}  # fmt: skip
    views = [VIEWS[key](*(inputs[n] for n in VIEWS[key].needs)) for key in VIEWS.names()]
    n = default_subsample_n(scores, primary)[0] if subsample_n is None else subsample_n  # as Tab. A6 chose it
    return views, {"frame": frame, "primary": primary, "model": model, "scores": scores, "n": n, "convention": convention}


def _gallery_figures(export: str | Path | None, fig_dir: Path, seed: int, formats: tuple[str, ...]) -> list[Figure]:
    out = []
    for key, title, count, skip in (("fig2", "Fig. 2 — certified OOD images", 14, 0), ("figA5", "Fig. A5 — more certified OOD images", 42, 14)):
        fg = Figure(key, title, "Verified OOD label in green, the original ImageNet-1k label the image was collected under in red (a seeded random draw of the construction export's ood.csv).")
        items = gallery_items(export, count, skip, seed)
        if items:
            fg.path = figs.save_figure(figs.gallery(items, title), fig_dir / f"{key}_gallery.png", formats)
        else:
            fg.note = "omitted: " + ("no construction export given (--gallery EXPORT_DIR)" if export is None else f"the export holds no more than {skip} OOD images")
        out.append(fg)
    return out


def _figures(df: pd.DataFrame, results_path: Path, choice: dict, fig_dir: Path, draws: int, seed: int, sweeps: pd.DataFrame | None, formats: tuple[str, ...]) -> list[Figure]:
    frame, primary, model, scores = choice["frame"], choice["primary"], choice["model"], choice["scores"]
    out: list[Figure] = []
    f = full_split(frame)
    f = f[f["vocabulary"].isna()]
    # Fig. 1
    fig1 = Figure("fig1", "Fig. 1 — best detector per OOD set", f"{model}: lowest FPR@95 over its detectors on every full-size OOD set; error bars: bootstrap 95% CIs.")
    mf = f[f["model"] == model]
    if len(mf):
        full_size = mf[~mf["dataset"].str.endswith(CLEAN_SUFFIX)]
        best = pd.DataFrame([best_row(g) for _, g in full_size.groupby("dataset", sort=False)])
        best = best[[c for c in ("dataset", "fpr95", "det", "fpr95_lo", "fpr95_hi") if c in best.columns]]
        fig1.path = figs.save_figure(figs.best_per_dataset(best, model), fig_dir / "fig1_best_per_dataset.png", formats)
    else:
        fig1.note = "omitted: no results"
    out.append(fig1)
    # ROC
    roc = Figure("roc", "ROC curves", f"{model} on {primary}: the five detectors with the lowest FPR@95 (ID positive).")
    on_primary = scores.get(primary, {})
    if on_primary:
        ranked, rest = [], mf[mf["dataset"] == primary]
        while len(rest) and len(ranked) < 5:
            ranked.append(best_row(rest)["det"])
            rest = rest[rest["det"] != ranked[-1]]
        curves = {d: on_primary[d] for d in ranked if d in on_primary}
        roc.path = figs.save_figure(figs.roc_curves(curves, f"{model} — {primary}"), fig_dir / "roc.png", formats)
    else:
        roc.note = "omitted: no stored scores on the primary set"
    out.append(roc)
    # histograms: each model's best detector on the primary set
    hist = Figure("hist", "ID vs OOD score histograms", f"Each model's best detector (FPR@95) on {primary}; dashed: the TPR95 threshold.")
    panels = {}
    rows = add_det(df[(df["status"] == "ok") & (df["split"] == ALL_SPLIT) & (df["dataset"] == primary) & df["vocabulary"].isna()])
    for m, g in rows.groupby("model", sort=False):
        g = g[g["seed"] == g["seed"].min()]
        r = best_row(g)
        try:
            panels[m] = (r["det"], *load_cell_scores(r, results_path))
        except (OSError, ValueError):
            continue
    if panels:
        hist.path = figs.save_figure(figs.histograms(dict(list(panels.items())[:9]), primary), fig_dir / "histograms.png", formats)
    else:
        hist.note = "omitted: no stored scores on the primary set"
    out.append(hist)
    # Fig. A4
    a4 = Figure("figA4", "Fig. A4 — sub-sampling bands", f"{model}: mean FPR@95 over {draws} draws of n images, ± 2 std; dotted: full-set values; black: {primary}; gray: n = {choice['n']}.")
    others = {d: s for d, s in scores.items() if d != primary}
    curves = subsampling_curves(others, draws=draws, seed=seed) if others else {}
    if curves:
        ref = (primary, float(mf[mf["dataset"] == primary]["fpr95"].min())) if primary in set(mf["dataset"]) else None
        a4.path = figs.save_figure(figs.subsampling_bands(curves, model, ref, choice["n"]), fig_dir / "figA4_subsampling.png", formats)
    else:
        a4.note = "omitted: needs stored scores on at least one OOD set besides the primary one with 12 or more images"
    out.append(a4)
    out.append(ranks.ranks_figure(df, choice.get("convention", "paper"), fig_dir, formats))
    # Fig. A3: sweeps over k negatives per class from the merged pool
    merged = sweeps[sweeps["sweep"].str.lower().str.startswith("merged")] if sweeps is not None and len(sweeps) else None
    a3 = Figure("figA3", "Fig. A3 — size of the merged per-class negative pool", f"FPR@95 against k negatives kept per ID class, mean over models; solid: {primary}, dashed: the other OOD sets.")
    if merged is not None and len(merged):
        a3.path = figs.save_figure(figs.merged_pool(merged, primary), fig_dir / "figA3_merged_pool.png", formats)
        sweeps = sweeps.drop(merged.index)
    else:
        a3.note = "omitted: no sweep named 'merged...' (oodeval.report.save_sweep(results, 'merged_pool', model, dataset, sizes, fpr95))"
    out.append(a3)
    # Fig. A1 / A2
    if sweeps is None or len(sweeps) == 0:
        out.append(Figure("figA1", "Fig. A1 / A2 — vocabulary-size curves", "", note="omitted: no vocabulary sweep data (oodeval.report.save_sweep)"))
    else:
        for i, (name, g) in enumerate(sweeps.groupby("sweep", sort=False)):
            for j, (dataset, gd) in enumerate(g.groupby("dataset", sort=False)):
                log_x = "wordnet" in name.lower() or ("param" in gd and (gd["param"] == "M").any())
                key = f"sweep{i}_{j}"
                fg = Figure(key, f"Fig. {'A2' if log_x else 'A1'} — {name} on {dataset}", "FPR@95 against vocabulary size: gray per model, blue the mean.")
                curve = figs.vocabulary_curves(gd, f"{name} — {dataset}", "pool size M" if log_x else "negatives per ID class k", log_x=log_x)
                fg.path = figs.save_figure(curve, fig_dir / f"{key}.png", formats)
                out.append(fg)
    return out


def write_report(
    results: str | Path,
    out_dir: str | Path,
    *,
    primary: str | None = None,
    model: str | None = None,
    subsample_n: int | None = None,
    draws: int = 1000,
    seed: int = 0,
    sweeps: str | Path | pd.DataFrame | None = None,
    title: str = "oodeval report",
    experiment=None,
    convention: str = "paper",
    gallery: str | Path | None = None,
    formats: tuple[str, ...] = figs.FORMATS,
) -> dict[str, Path]:
    """Write ``report.md``, ``report.tex``, ``report.html`` (self-contained) and ``figures/*`` (PNG, PDF, SVG).

    ``results``: the Parquet table (or a :class:`~oodeval.experiment.RunSummary`); ``primary``: the
    OOD set of Tabs. 1, A1, 2 (default: the first in the table); ``model``: the model of Tab. 3, A3,
    A6 and Fig. 1, A4, ROC (default: the supervised model with the best Top-1, as the paper); ``subsample_n``:
    the draw size of Tab. A6 (default: the primary set's size, the paper's, capped at half the smallest
    other OOD set, :func:`~oodeval.report.subsampling.default_subsample_n`); ``draws``/``seed``: sub-sampling.
    ``experiment`` (a path or :class:`~oodeval.experiment.ExperimentConfig`): show only its declared
    configurations (:mod:`oodeval.report.selection`) and take its OOD groups; ``convention``: which
    FPR@95 leads in Tabs. 1 and A1, ``"paper"`` (ID positive) or ``"openood"`` (OOD positive, OpenOOD
    and pytorch-ood), the other beside it (docs/detectors.md); ``gallery``: a construction export folder
    whose ``ood.csv`` images make Fig. 2 / A5; ``formats``: figure files besides the PNG (PDF, SVG).
    Returns ``{"markdown", "latex", "html", <figure key>: PNG path, ...}``. ``out_dir`` is created, or
    rewritten when it is an earlier report; any other existing file or folder there is refused.
    """
    if convention not in CONVENTIONS:
        raise InputError(f"convention must be one of {', '.join(CONVENTIONS)}, got {convention!r}")
    results = Path(getattr(results, "results", results))
    if not results.is_file() and not parts_dir(results).is_dir():
        raise FileNotFoundError(f"results table {results} does not exist (run `oodeval run` first)")
    df = load_results(results)
    if len(df) == 0:
        raise InputError(f"results table {results} has no rows")
    _check_values(df, results)
    damaged = missing_cell_scores(df, results)
    if damaged:
        raise InputError(f"{len(damaged)} score file(s) of {results} are missing or damaged ({damaged[0]}); "
                         "the figures and tables drawn from them would be wrong: rerun `oodeval run` (with retry) to recompute them")
    if experiment is not None:
        experiment = load_config(experiment)
    selection = select_configurations(df, experiment)
    df = selection.rows
    if len(df) == 0:
        raise InputError(f"results table {results} holds no cell of a configuration declared by experiment {experiment.name!r}")
    df = _with_ood_positive(df, results)
    groups = {d.label: d.group for d in experiment.ood if d.group} if experiment is not None else None
    out_dir = claim_folder(out_dir, "report")
    fig_dir = claim_folder(out_dir / "figures", "report")
    paths: dict[str, Path] = {"markdown": out_dir / "report.md", "latex": out_dir / "report.tex", "html": out_dir / "report.html"}
    for page in paths.values():  # a report stopped midway (a full disk) leaves no earlier text beside new figures
        remove_own(page)
    if sweeps is None and sweeps_path(results).exists():
        sweeps = sweeps_path(results)
    if sweeps is not None and not isinstance(sweeps, pd.DataFrame):
        sweeps = pd.read_parquet(sweeps)
    views, choice = build_views(df, results, primary=primary, model=model, subsample_n=subsample_n, draws=draws, seed=seed, groups=groups,
                                convention=convention)  # fmt: skip
    figures = _figures(df, results, choice, fig_dir, draws, seed, sweeps, formats) + _gallery_figures(gallery, fig_dir, seed, formats)
    n_ok, n_err = int((df["status"] == "ok").sum()), int((df["status"] != "ok").sum())
    intro = (
        f"From {results.name}: {n_ok} evaluated cells ({n_err} failed, not shown), "
        f"{df['model'].nunique()} model(s), {df['dataset'].nunique()} OOD set(s), seeds {sorted(set(df['seed'].tolist()))}. "
        f"Primary OOD set: {choice['primary']}; figure model: {choice['model']}. Values in % (means over seeds); "
        "FPR@95 lower is better, AUROC higher is better. FPR@95 is the paper's (ID positive: the share of OOD accepted "
        "at 95% ID recall) wherever a table does not say otherwise; FPR@95 OOD-pos is OpenOOD's and pytorch-ood's (OOD "
        f"positive: the share of ID rejected at 95% OOD recall), shown beside it in Tabs. 1 and A1"
        f"{' and leading there' if convention == 'openood' else ''} (docs/detectors.md). Brackets: bootstrap 95% CIs "
        f"({'OOD resampled, ID threshold fixed' if df['bootstrap_fixed_id'].fillna(True).all() else 'as recorded per cell'}; "
        "bounds averaged over seeds). Best detector: lowest FPR@95 (highest AUROC for AUROC), ties to the better other "
        f"metric, then the paper's detector order. {selection.statement}"
    )
    random = sorted(set(df.loc[df["random_init"].fillna(False).astype(bool), "model"]))
    if random:
        intro += (f" RANDOM-INIT WEIGHTS: {', '.join(random)} ran with randomly initialised weights (chosen with "
                  "pretrained = false / --pretrained none); their numbers are a baseline, not a trained model's.")
    summary = run_summary(df, views, figures, choice, convention)
    write_text_atomic(paths["markdown"], markdown(title, intro, views, figures, out_dir, summary))
    write_text_atomic(paths["latex"], latex(title, intro, views, figures, out_dir, summary))
    write_text_atomic(paths["html"], html_page(title, intro, views, figures, summary))
    for f in figures:
        if f.path:
            paths[f.key] = Path(f.path)
    return paths
