"""Which configuration of a detector a report shows: a stated rule, never the best on the test sets.

A results table may hold several configurations of one (model, detector), e.g. knn k=5 from an
earlier run beside k=10 from the current one. Picking the better of them on the test sets would
tune hyperparameters on the test data, so the report applies one of two stated rules:

- ``declared`` (an experiment is given): only the configurations the experiment declares are shown
  (its detector lists; a model without a list declares every detector at its defaults). Rows of
  other configurations stay in the table but are left out of the report, and their number is said.
- ``all`` (no experiment): every configuration is its own row, labelled with its hyperparameters
  (``knn k=5``, ``knn k=10``), and the report names each detector that has several, so a "best"
  among them is never chosen silently.

A configuration declared with a ``search`` (``oodeval.experiment.validation``) is one declared
configuration whose hyperparameters were chosen on the validation data named in the experiment; the
report states each such choice as recorded with its rows (column ``selection``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from .labels import detector_label
from .views import hp_text

__all__ = ["Selection", "select_configurations"]


@dataclass(frozen=True)
class Selection:
    """The rows a report shows and the sentence that states the rule applied."""

    rows: pd.DataFrame
    rule: str
    statement: str


def _declared_mask(df: pd.DataFrame, experiment) -> pd.Series:
    keep = pd.Series(False, index=df.index)
    for model in experiment.models:
        mine = df["model"] == model.label
        specs = experiment.detectors_for(model)
        if specs is None:  # every supported detector at its defaults
            keep |= mine & (df["hyperparameters"] == "{}")
            continue
        for spec in specs:
            keep |= mine & (df["detector"] == spec.name) & (df["hyperparameters"] == spec.result_key)
    return keep


def _several(df: pd.DataFrame) -> list[str]:
    ok = df[df["status"] == "ok"]
    label = ok["label"].fillna(ok["detector"]).astype(str) + ok["vocabulary"].astype("string").fillna("").map(lambda v: f"[{v}]" if v else "")
    out = []
    for (model, det), g in ok.assign(det=label).groupby(["model", "det"], sort=False):
        hps = list(dict.fromkeys(g["hyperparameters"].astype(str)))
        if len(hps) > 1:
            out.append(f"{detector_label(det)} on {model} ({'; '.join(hp_text(h) for h in hps)})")
    return out


def _validation_choices(df: pd.DataFrame) -> str:
    ok = df[(df["status"] == "ok") & df["selection"].notna()] if "selection" in df.columns else df.iloc[:0]
    if len(ok) == 0:
        return ""
    choices = ok.drop_duplicates(["model", "detector", "hyperparameters", "weights"])
    listed = "; ".join(f"{detector_label(r['label'] or r['detector'])} on {r['model']}: {r['selection']}" for _, r in choices.iterrows())
    return f" Chosen on validation data, never on a test set: {listed}."


def select_configurations(df: pd.DataFrame, experiment=None) -> Selection:
    """Apply the ``declared`` rule when ``experiment`` (an :class:`~oodeval.experiment.ExperimentConfig`)
    is given, else the ``all`` rule; see the module docstring."""
    if experiment is not None:
        keep = _declared_mask(df, experiment)
        dropped = int(((df["status"] == "ok") & ~keep).sum())
        statement = (
            f"Configurations: those declared by experiment {experiment.name!r} (the defaults where it lists no detectors)"
            + (f"; {dropped} evaluated cell(s) of other configurations in the table are not shown." if dropped else ".")
        )
        return Selection(df[keep], "declared", statement + _validation_choices(df[keep]))
    several = _several(df)
    statement = "Configurations: every configuration in the table is shown" + (
        "; detectors with several configurations appear once per configuration, labelled with its hyperparameters, "
        "and no best among them is chosen on the test sets (give the experiment to show only the declared one): " + "; ".join(several) + "."
        if several
        else " (one per model and detector)."
    )
    return Selection(df, "all", statement + _validation_choices(df))
