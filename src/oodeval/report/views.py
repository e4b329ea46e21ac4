"""The report's building blocks: a :class:`Cell` (text + emphasis) and a :class:`View` (one table,
or a note saying why it is omitted), the prepared results frame every table reads, and the
registry of views (:func:`register_view`): a view is one decorated function, and
``oodeval.report.build_views`` calls every registered one in order."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import detectors
from ..errors import InputError
from ..experiment.zeroshot import vocabulary_generation
from ..registry import Registry
from ..results import ALL_SPLIT
from ..zeroshot.scorers import ZS_PREFIX

__all__ = ["Cell", "View", "Figure", "VIEWS", "VIEW_INPUTS", "register_view", "prepare", "add_det", "mark_zero_shot", "full_split", "pct", "pct_ci", "row_ci", "order_detectors", "best_row", "hp_text",
           "vocabulary_columns"]


@dataclass(frozen=True)
class Cell:
    """A table cell: text, shown bold and/or underlined (the paper's best-value marks), muted (a
    placeholder, a lower bound), with ``title`` as the HTML page's tooltip (a detector label's
    registry name, :func:`oodeval.report.labels.det_cell`). A Cell may also head a column."""

    text: str
    bold: bool = False
    underline: bool = False
    muted: bool = False
    title: str = ""

    def __str__(self) -> str:
        return self.text


@dataclass
class View:
    """One table of the report. ``frame`` holds str/Cell values; None means omitted (see ``note``)."""

    key: str
    title: str
    caption: str
    frame: pd.DataFrame | None = None
    note: str = ""

    @property
    def present(self) -> bool:
        return self.frame is not None and len(self.frame) > 0


@dataclass
class Figure:
    """One figure of the report: ``path`` its PNG (PDF and SVG beside it), None when omitted, with ``note`` saying why."""

    key: str
    title: str
    caption: str
    path: object = None
    note: str = ""


#: what a view may ask for (``needs``): the prepared frame (:func:`prepare`), the primary OOD set
#: ("" when none), the figure model, the OOD groups (set -> group), the raw results rows, the
#: figure model's stored scores (``subsampling.model_scores``), the Tab. A6 draw size asked for (None:
#: ``subsampling.default_subsample_n``), draws and seed,
#: and the FPR@95 convention that leads (``paper`` or ``openood``, ``oodeval.metrics.FPR95_CONVENTIONS``)
VIEW_INPUTS = ("frame", "primary", "model", "groups", "results", "scores", "subsample_n", "draws", "seed", "convention")


#: report views by key, in report order; the built-in ones register when ``oodeval.report`` is imported
#: (it imports their modules), plugins name a module in the entry-point group ``oodeval.report_views``
VIEWS = Registry("report view", "oodeval.report_views")


def register_view(key: str, *, order: int | None = None, needs: tuple[str, ...] = ("frame",)) -> Callable:
    """Function decorator: ``key`` becomes a report view, called as ``fn(*inputs)`` with the
    :data:`VIEW_INPUTS` named in ``needs`` (in that order) and returning a :class:`View`; ``order``
    places it among the others (the paper's tables use 10, 20, ...; none: after them)."""
    unknown = sorted(set(needs) - set(VIEW_INPUTS))
    if unknown:
        raise InputError(f"view {key!r} needs unknown input(s) {', '.join(unknown)}; inputs: {', '.join(VIEW_INPUTS)}")

    def deco(fn: Callable[..., View]) -> Callable[..., View]:
        fn.needs = tuple(needs)
        return VIEWS.register(key, order=order)(fn)

    return deco


def pct(value: float, digits: int = 1) -> str:
    """A fraction as a percentage string ("-" for missing)."""
    if value is None or not np.isfinite(value):
        return "–"
    return f"{100 * value:.{digits}f}"


def pct_ci(value: float, lo: float = float("nan"), hi: float = float("nan"), digits: int = 1) -> str:
    """A fraction as a percentage with its 95% CI: ``"65.0 [63.1, 66.9]"`` (the bounds left out when missing)."""
    text = pct(value, digits)
    if text == "–" or lo is None or hi is None or not (np.isfinite(lo) and np.isfinite(hi)):
        return text
    return f"{text} [{pct(lo, digits)}, {pct(hi, digits)}]"


def row_ci(row: pd.Series, metric: str) -> str:
    """``pct_ci`` of a prepared row's ``metric`` with its ``<metric>_lo`` / ``<metric>_hi`` bounds."""
    return pct_ci(row[metric], row.get(f"{metric}_lo", np.nan), row.get(f"{metric}_hi", np.nan))


def _detector_rank() -> dict[str, int]:
    try:
        from ..zeroshot.scorers import scorer_names as zs_names

        zs = zs_names()
    except Exception:  # noqa: BLE001 - zero-shot package optional for ordering
        zs = []
    supervised = detectors.names()
    paper = supervised + [n for n in zs if n not in supervised]
    return {n: i for i, n in enumerate(paper)}


def _label_key(label: str, rank: dict[str, int]) -> tuple:
    base = label.split(" ", 1)[0].split("[", 1)[0].removeprefix(ZS_PREFIX)
    return (rank.get(base, len(rank)), label)


def order_detectors(labels: list[str]) -> list[str]:
    """Detector labels in the paper's order (registry order), unknown ones after, alphabetically."""
    rank = _detector_rank()
    return sorted(set(labels), key=lambda label: _label_key(label, rank))


def best_row(rows: pd.DataFrame, metric: str = "fpr95") -> pd.Series:
    """The row naming the best detector, by the one rule of every report view and figure (and the
    demo's printed sub-sampling table, which reuses them):
    lowest FPR@95 (``metric="fpr95"``) or highest AUROC (``metric="auroc"``); ties go to the better
    other metric, then to the detector earlier in the paper's order, then to the label."""
    if len(rows) == 0:
        raise InputError("best_row of no rows")
    rank = _detector_rank()
    other = "auroc" if metric == "fpr95" else "fpr95"
    sign = {"fpr95": 1.0, "auroc": -1.0}
    keys = [
        (sign[metric] * r[metric], sign[other] * r[other], *_label_key(str(r["det"]), rank), i)
        for i, (_, r) in enumerate(rows.iterrows())
    ]
    keys = [tuple(np.inf if isinstance(v, float) and np.isnan(v) else v for v in k) for k in keys]
    return rows.iloc[min(keys)[-1]]


def hp_text(hp_json_text: str) -> str:
    """A configuration's overrides for display: ``{"k":5,"t":2.0}`` -> ``k=5, t=2.0``; ``{}`` -> ``defaults``;
    ``{"defaults":"openood","k":5}`` -> ``openood defaults, k=5``."""
    hp = json.loads(hp_json_text) if hp_json_text else {}
    hp.pop("vocabulary", None)
    search = hp.pop("search", {})
    profile = hp.pop("defaults", None)  # a defaults profile (oodeval.detectors.profiles): "openood defaults"
    parts = [f"{k}={v}" for k, v in hp.items()] + [f"{k} searched in {v}" for k, v in search.items()]
    parts = ([f"{profile} defaults"] if profile is not None else []) + parts
    return ", ".join(parts) or "defaults"


def mark_zero_shot(labels: pd.Series, kinds: pd.Series) -> pd.Series:
    """``labels`` with :data:`~oodeval.zeroshot.scorers.ZS_PREFIX` before each zero-shot row's
    label (``kinds`` == "zero-shot") that a post-hoc row of the same rows shows too."""
    zero_shot = kinds.eq("zero-shot").fillna(False).astype(bool)
    shared = labels.isin(set(labels[zero_shot])) & labels.isin(set(labels[~zero_shot]))
    return labels.where(~(shared & zero_shot), ZS_PREFIX + labels.astype(str))


def add_det(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with a display column ``det``: the detector label, ``[vocabulary]`` for vocabulary
    scorers, ``zs:`` before a zero-shot scorer's label that post-hoc rows of ``rows`` show too
    (column ``kind``), and the hyperparameters where one model ran a label with several settings."""
    rows = rows.copy()
    if len(rows) == 0:
        return rows.assign(det=pd.Series(dtype="string"))
    label = rows["label"].fillna(rows["detector"]).astype(str)
    vocab = rows["vocabulary"].astype("string")
    rows["det"] = np.where(vocab.isna(), label, label + "[" + vocab.fillna("") + "]")
    if "kind" in rows:
        rows["det"] = mark_zero_shot(rows["det"], rows["kind"])
    clash = rows.groupby(["model", "det"])["hyperparameters"].transform("nunique") > 1
    rows.loc[clash, "det"] = rows.loc[clash, "det"] + " " + rows.loc[clash, "hyperparameters"].astype(str).map(hp_text)
    return rows


def prepare(df: pd.DataFrame) -> pd.DataFrame:
    """The ok rows with a display column ``det`` (label, plus vocabulary and hyperparameters
    where needed to tell configurations apart), averaged over seeds and weights.

    Columns: model, kind, det, detector, hyperparameters, vocabulary, dataset, split, fpr95, tnr95,
    auroc, detection_error, id_accuracy, n_ood, runs (seeds; a test-time scorer's stream orders), streams
    (how many of them were test-time streams, with a ``stream`` column), the CI bounds ``fpr95_lo/hi``,
    ``auroc_lo/hi`` (each run's bootstrap bounds, averaged over runs), ``fpr95_ood_positive`` with its
    bounds, and aupr_in / aupr_out, aupr_in_trapezoid / aupr_out_trapezoid, autc, aurc, augrc.
    """
    ok = add_det(df[df["status"] == "ok"])
    if len(ok) == 0:
        return ok.assign(runs=pd.Series(dtype="int64"))
    vocab = ok["vocabulary"].astype("string")
    keys = ["model", "kind", "det", "detector", "hyperparameters", "dataset", "split"]
    ok["vocabulary"] = vocab.fillna("")
    means = ["fpr95", "tnr95", "auroc", "detection_error", "id_accuracy", "fpr95_lo", "fpr95_hi", "auroc_lo", "auroc_hi",
             "fpr95_ood_positive", "fpr95_ood_positive_lo", "fpr95_ood_positive_hi", "aupr_in", "aupr_out",
             "aupr_in_trapezoid", "aupr_out_trapezoid", "autc", "aurc", "augrc"]
    means = [m for m in means if m in ok.columns]
    agg = (
        ok.groupby(keys + ["vocabulary"], sort=False, dropna=False)
        .agg(**{m: (m, "mean") for m in means}, n_ood=("n_ood", "first"), runs=("seed", "size"),
             **({"streams": ("stream", "count")} if "stream" in ok.columns else {}))
        .reset_index()
    )
    agg["vocabulary"] = agg["vocabulary"].replace("", None)
    return agg


def full_split(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows over whole OOD sets (split ``all``)."""
    return frame[frame["split"] == ALL_SPLIT]


def vocabulary_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """The vocabulary rows with ``col`` (the vocabulary without its generation suffix, prefixed by
    the scorer when several scorers share it) and ``gen`` (its LLM generation, or NaN)."""
    v = frame[frame["vocabulary"].notna()]
    split = [vocabulary_generation(str(x)) for x in v["vocabulary"]]
    v = v.assign(base=[b for b, _ in split], gen=[np.nan if g is None else g for _, g in split])
    shared = v.groupby("base")["detector"].nunique() > 1
    return v.assign(col=[f"{d}:{b}" if shared.get(b, False) else b for d, b in zip(v["detector"], v["base"])])
