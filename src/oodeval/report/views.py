"""The report's building blocks: a :class:`Cell` (text + emphasis) and a :class:`View` (one table,
or a note saying why it is omitted), plus the prepared results frame every table reads."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..results import ALL_SPLIT

__all__ = ["Cell", "View", "Figure", "prepare", "add_det", "full_split", "pct", "order_detectors"]


@dataclass(frozen=True)
class Cell:
    """A table cell: text, shown bold and/or underlined (the paper's best-value marks)."""

    text: str
    bold: bool = False
    underline: bool = False
    muted: bool = False

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
    """One PNG figure of the report (``path`` None when omitted, with ``note`` saying why)."""

    key: str
    title: str
    caption: str
    path: object = None
    note: str = ""


def pct(value: float, digits: int = 1) -> str:
    """A fraction as a percentage string ("-" for missing)."""
    if value is None or not np.isfinite(value):
        return "–"
    return f"{100 * value:.{digits}f}"


def order_detectors(labels: list[str]) -> list[str]:
    """Detector labels in the paper's order (registry order), unknown ones after, alphabetically."""
    from .. import detectors

    try:
        from ..zeroshot.scorers import names as zs_names

        zs = zs_names()
    except Exception:  # noqa: BLE001 - zero-shot package optional for ordering
        zs = []
    supervised = detectors.names()
    paper = supervised + [n for n in zs if n not in supervised]
    rank = {n: i for i, n in enumerate(paper)}

    def key(label: str) -> tuple:
        base = label.split(" ", 1)[0].split("[", 1)[0]
        return (rank.get(base, len(rank)), label)

    return sorted(set(labels), key=key)


def add_det(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with a display column ``det``: the detector label, ``[vocabulary]`` for vocabulary
    scorers, and the hyperparameters where one model ran a label with several settings."""
    rows = rows.copy()
    if len(rows) == 0:
        return rows.assign(det=pd.Series(dtype="string"))
    label = rows["label"].fillna(rows["detector"]).astype(str)
    vocab = rows["vocabulary"].astype("string")
    rows["det"] = np.where(vocab.isna(), label, label + "[" + vocab.fillna("") + "]")
    hp = rows["hyperparameters"].astype(str)
    hp = hp.where(vocab.isna(), hp.str.replace(r',?"vocabulary":"[^"]*"', "", regex=True).str.replace("{,", "{"))
    clash = rows.groupby(["model", "det"])["hyperparameters"].transform("nunique") > 1
    rows.loc[clash, "det"] = rows.loc[clash, "det"] + " " + hp[clash]
    return rows


def prepare(df: pd.DataFrame) -> pd.DataFrame:
    """The ok rows with a display column ``det`` (label, plus vocabulary and hyperparameters
    where needed to tell configurations apart), averaged over seeds and weights.

    Columns: model, kind, det, detector, vocabulary, dataset, split, fpr95, tnr95, auroc,
    detection_error, id_accuracy, n_ood, runs.
    """
    ok = add_det(df[df["status"] == "ok"])
    if len(ok) == 0:
        return ok.assign(runs=pd.Series(dtype="int64"))
    vocab = ok["vocabulary"].astype("string")
    keys = ["model", "kind", "det", "detector", "dataset", "split"]
    ok["vocabulary"] = vocab.fillna("")
    agg = (
        ok.groupby(keys + ["vocabulary"], sort=False, dropna=False)
        .agg(
            fpr95=("fpr95", "mean"),
            tnr95=("tnr95", "mean"),
            auroc=("auroc", "mean"),
            detection_error=("detection_error", "mean"),
            id_accuracy=("id_accuracy", "mean"),
            n_ood=("n_ood", "first"),
            runs=("seed", "size"),
        )
        .reset_index()
    )
    agg["vocabulary"] = agg["vocabulary"].replace("", None)
    return agg


def full_split(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows over whole OOD sets (split ``all``)."""
    return frame[frame["split"] == ALL_SPLIT]
