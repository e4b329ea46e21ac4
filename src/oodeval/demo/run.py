"""``oodeval demo`` end to end: data -> trained convnet -> experiment file -> grid -> report -> tables.

Every step after training is the path an ImageNet user takes: the demo writes an ordinary
experiment file (``<out>/experiment.toml``) naming the built datasets (user datasets under the
data root) and the trained weights, runs it with :func:`oodeval.experiment.run_experiment`
(extraction into the feature store with NAC taps, all 21 detectors fitted once on ID-train,
metrics with 95% bootstrap CIs, one Parquet results table) and writes the HTML report with
:func:`oodeval.report.write_report`. Each step is cached (data by spec hash, weights by content
hash, features by the store, cells by the results table), so a repeat run only re-reads.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TextIO

import torch

from .. import detectors
from .._io import claim_folder, write_text_atomic
from ..errors import InputError
from ..experiment import run_experiment
from ..results import ALL_SPLIT, load_results
from .data import OOD_SETS, SET_NAMES, DemoSizes, build_benchmark
from .train import DemoTrainConfig, TrainedModel, train_model

__all__ = ["DemoResult", "run_demo", "experiment_dict", "to_toml", "ood_tables", "format_tables", "MODEL_LABEL"]

MODEL_LABEL = "demo-convnet"
#: report label of each OOD set (folder name without the ``demo-`` prefix)
OOD_LABELS = {name: name.removeprefix("demo-") for name in OOD_SETS}
PRIMARY = OOD_LABELS["demo-fmnist-heldout"]


@dataclass
class DemoResult:
    """What one demo run produced: paths, the model, the per-OOD-set tables and step timings."""

    out: Path
    experiment: Path
    results: Path
    report: dict[str, Path]
    model: TrainedModel
    tables: dict[str, list[dict]]
    subsampling: object
    summary: object
    text: str
    timings: dict[str, float] = field(default_factory=dict)


def _knn_k(n_train: int) -> int:
    """kNN's k at about 1 per 1000 bank images (k=50 for CIFAR's 50k, k=1000 for ImageNet's 1.28M)."""
    return max(1, round(n_train / 1000))


def experiment_dict(out: Path, data_root: Path, model: TrainedModel, n_train: int, seed: int, draws: int, batch_size: int) -> dict:
    """The experiment (``oodeval run`` format, docs/experiments.md) the demo runs."""
    dets: list = []
    for name in detectors.names("paper21"):
        dets.append({"name": name, "hyperparameters": {"k": _knn_k(n_train)}} if name == "knn" else name)
    return {
        "name": "oodeval-demo",
        "store": str(out / "store"),
        "results": str(out / "results.parquet"),
        "data_root": str(data_root),
        "seeds": [seed],
        "bootstrap_draws": draws,
        "batch_size": batch_size,
        "device": "cpu",
        "datasets": {
            "id_train": SET_NAMES["id_train"],
            "id_test": SET_NAMES["id_test"],
            "ood": [{"name": name, "label": label} for name, label in OOD_LABELS.items()],
        },
        "models": [
            {
                "name": model.arch,
                "label": MODEL_LABEL,
                "weights": str(model.weights),
                "model_kwargs": model.model_kwargs,
                "taps": True,
            }
        ],
        "detectors": dets,
    }


def to_toml(exp: dict) -> str:
    """TOML text of an experiment dict (tomli-w), under a comment saying how to rerun it."""
    import tomli_w

    return "# written by `oodeval demo`; rerun with `oodeval run` on this file\n\n" + tomli_w.dumps(exp)


def ood_tables(results: Path, model: str = MODEL_LABEL) -> dict[str, list[dict]]:
    """Per OOD set, one row per detector (sorted by FPR@95, then AUROC): fpr95, auroc and their
    95% CI bounds (fractions), fpr95_ood_positive (the OpenOOD / pytorch-ood FPR@95), with
    ``best_fpr`` / ``best_auroc`` marking the column's best."""
    df = load_results(results)
    df = df[(df["model"] == model) & (df["split"] == ALL_SPLIT) & (df["status"] == "ok")]
    out: dict[str, list[dict]] = {}
    for label in OOD_LABELS.values():
        g = df[df["dataset"] == label]
        if len(g) == 0:
            continue
        g = g.sort_values(["fpr95", "auroc", "detector"], ascending=[True, False, True])
        best_fpr, best_auc = g["fpr95"].min(), g["auroc"].max()
        out[label] = [
            {
                "detector": r.label if isinstance(r.label, str) and r.label else r.detector,
                "fpr95": float(r.fpr95),
                "fpr95_lo": float(r.fpr95_lo),
                "fpr95_hi": float(r.fpr95_hi),
                "fpr95_ood_positive": float(r.fpr95_ood_positive),
                "auroc": float(r.auroc),
                "auroc_lo": float(r.auroc_lo),
                "auroc_hi": float(r.auroc_hi),
                "n_id": int(r.n_id),
                "n_ood": int(r.n_ood),
                "best_fpr": bool(r.fpr95 == best_fpr),
                "best_auroc": bool(r.auroc == best_auc),
            }
            for r in g.itertuples()
        ]
    return out


def format_tables(tables: dict[str, list[dict]]) -> str:
    """Plain-text tables (pandas ``to_string``), one per OOD set: FPR@95 (the paper's, ID positive)
    and AUROC in % with [95% CI], FPR@95 OOD-pos (OpenOOD / pytorch-ood) beside; * = best in column."""
    import pandas as pd

    def pct(r: dict, m: str, best: str) -> list[str]:
        return [f"{100 * r[m]:.1f}" + ("*" if r[best] else " "), f"[{100 * r[m + '_lo']:.1f}, {100 * r[m + '_hi']:.1f}]"]

    blocks = []
    for label, rows in tables.items():
        kind = OOD_SETS.get(f"demo-{label}", "")
        head = f"OOD set {label} ({kind}-OOD, {rows[0]['n_ood']} images; ID test {rows[0]['n_id']} images)"
        frame = pd.DataFrame([[r["detector"], *pct(r, "fpr95", "best_fpr"), f"{100 * r['fpr95_ood_positive']:.1f}",
                               *pct(r, "auroc", "best_auroc")] for r in rows],
                             columns=["detector", "FPR@95 ID-pos %", "[95% CI]", "FPR@95 OOD-pos %", "AUROC %", "[95% CI]"])  # fmt: skip
        blocks.append(head + "\n" + frame.to_string(index=False))
    return "\n\n".join(blocks) + ("\n  (* = best in the column; FPR@95 lower is better, AUROC higher is better; ID-pos: OOD "
                                  "accepted at 95% ID recall, the paper's; OOD-pos: ID rejected at 95% OOD recall, OpenOOD's "
                                  "and pytorch-ood's)\n")


def _subsampling(df, results: Path, n: int, draws: int, seed: int):
    """The report's Tab. A6 view (stats.subsample, standard_error, rank_stability) at draw size n;
    ``df`` is the loaded results table at ``results``."""
    from ..report.subsampling import model_scores, subsampling_table

    scores = model_scores(df, results, MODEL_LABEL)
    return subsampling_table(scores, n, draws=draws, seed=seed, model=MODEL_LABEL)


def run_demo(
    out: str | Path = "demo-out",
    *,
    quick: bool = False,
    seed: int = 0,
    epochs: int | None = None,
    draws: int | None = None,
    subsample_n: int | None = None,
    data_root: str | Path | None = None,
    batch_size: int = 256,
    threads: int | None = 1,
    progress: bool = True,
    stream: TextIO | None = None,
) -> DemoResult:
    """Run the demo into ``out`` and print its progress and tables to ``stream`` (stdout).

    ``threads``: torch intra-op threads during the run (restored afterwards; None = leave
    torch's default). The default 1 is deliberate: this tiny model on 28x28 batches gains
    little from a second thread, while a shared machine makes multi-threaded steps stall
    (docs/performance.md, "Measurements moved out of docstrings").

    ``quick`` shrinks every set (:meth:`DemoSizes.quick`), trains 2 epochs at batch 64 and uses
    200 bootstrap and sub-sampling draws; the defaults are the full demo (6 epochs at batch 128,
    1000 draws, sub-sampling n = 500).
    """
    previous = torch.get_num_threads()
    if threads is not None:
        if threads < 1:
            raise InputError(f"threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)
    try:
        return _run(out, quick, seed, epochs, draws, subsample_n, data_root, batch_size, progress, stream or sys.stdout)
    finally:
        torch.set_num_threads(previous)


def _run(
    out: str | Path, quick: bool, seed: int, epochs: int | None, draws: int | None, subsample_n: int | None,
    data_root: str | Path | None, batch_size: int, progress: bool, stream: TextIO,
) -> DemoResult:
    from ..report import write_report
    from ..report.views import Cell

    out = claim_folder(Path(out).resolve(), "demo")
    root = Path(data_root).resolve() if data_root else out / "data"
    sizes = DemoSizes.quick() if quick else DemoSizes()
    config = DemoTrainConfig(seed=seed, **({"epochs": 2, "batch_size": 64} if quick else {}))
    if epochs is not None:
        config = replace(config, epochs=epochs)
    draws = draws if draws is not None else (200 if quick else 1000)
    subsample_n = subsample_n if subsample_n is not None else (50 if quick else 500)
    timings: dict[str, float] = {}
    t_all = time.perf_counter()

    def step(i: int, text: str) -> float:
        print(f"[{i}/5] {text}  (t = {time.perf_counter() - t_all:.0f} s)", file=stream, flush=True)
        return time.perf_counter()

    t = step(1, f"benchmark data under {root}")
    sets = build_benchmark(root, sizes, seed=seed, progress=progress)
    timings["data"] = time.perf_counter() - t

    t = step(2, f"classifier {config.arch} on {sizes.id_train} ID-train images ({config.epochs} epochs)")
    model = train_model(sets["id_train"], sets["id_test"], out / "models", config, progress=progress)
    timings["train"] = time.perf_counter() - t
    print(
        f"      {'reused cached' if model.cached else 'trained'} {model.weights} "
        f"- ID test accuracy {100 * model.id_test_accuracy:.1f}% (chance {100 / len(model.class_names):.1f}%)",
        file=stream,
        flush=True,
    )

    exp_path = out / "experiment.toml"
    exp = experiment_dict(out, root, model, sizes.id_train, seed, draws, batch_size)
    write_text_atomic(exp_path, to_toml(exp))
    t = step(3, f"oodeval run {exp_path}: extract (NAC taps), 21 detectors, metrics with 95% CIs")
    summary = run_experiment(exp_path, progress=progress)
    timings["grid"] = time.perf_counter() - t
    print(f"      {summary}", file=stream, flush=True)
    for err in summary.errors[:5]:
        print(f"      failed: {err}", file=stream, flush=True)

    t = step(4, f"report into {out / 'report'}")
    report = write_report(summary.results, out / "report", primary=PRIMARY, model=MODEL_LABEL, subsample_n=subsample_n, draws=draws, seed=seed, title="oodeval demo")
    timings["report"] = time.perf_counter() - t

    t = step(5, "tables")
    tables = ood_tables(summary.results)
    df = load_results(summary.results)
    sub = _subsampling(df, summary.results, subsample_n, draws, seed)
    acc = df[(df["model"] == MODEL_LABEL) & (df["status"] == "ok")]["id_accuracy"]
    lines = [
        "",
        f"oodeval demo - ID: Fashion-MNIST classes {', '.join(model.class_names)}; model {model.arch} "
        f"(ID test accuracy {100 * model.id_test_accuracy:.1f}% at training, "
        f"{100 * float(acc.iloc[0]) if len(acc) else float('nan'):.1f}% from the extracted logits)",
        "",
        format_tables(tables),
        f"Sub-sampling (paper Tab. A6): {draws} draws of n={subsample_n} OOD images per set, ID set and threshold fixed, "
        "for the set's best detector; FPR@95 % full / mean / bias / std over draws vs the closed form "
        "sqrt(p(1-p)/n)*sqrt((N-n)/(N-1)); rho = mean Spearman rank correlation of all detectors, draw vs full set",
    ]
    if sub.frame is not None:
        # registry names, as the tables above print them (a Cell's title; the report shows the paper's labels)
        lines.append(sub.frame.map(lambda c: (c.title or c.text) if isinstance(c, Cell) else str(c)).to_string(index=False))
    else:
        lines.append(sub.note or "")
    timings["tables"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - t_all
    lines += ["", f"report: {report['html']}", f"total {timings['total']:.0f} s (" + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items() if k != "total") + ")"]
    text = "\n".join(lines)
    print(text, file=stream, flush=True)
    write_text_atomic(out / "tables.txt", text + "\n")
    return DemoResult(out, exp_path, summary.results, report, model, tables, sub, summary, text, timings)
