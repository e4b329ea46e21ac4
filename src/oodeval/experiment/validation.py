"""The opt-in hyperparameter search of a detector on validation data, never on a test set.

A detector entry with ``search = { k = [10, 50, 1000] }`` is built once per candidate (the grid's
product) by the grid's seam (``oodeval.scorer_factory.build_scorer``: the candidate's backbone defaults,
fitting rows and view, as on the test sets), fitted on its fitting rows and scored on
``[selection]``'s ``validation_id`` split and ``validation_ood`` set
(``oodeval.evaluation.fit_score_evaluate``, the loop of every command); the candidate with the lowest
FPR@95 wins (ties: the higher AUROC, then the earlier candidate in grid order). Only the winner is
evaluated on the test sets, and every one of its result rows records the choice (column
``selection``). This is the role of OpenOOD's APS mode and pytorch-ood's grid search, restricted to
data that the config names as validation data.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from itertools import product

from ..scorer_factory import Scorer
from ..evaluation import fit_score_evaluate

__all__ = ["choose_on_validation", "VALIDATION_ROLES"]

VALIDATION_ROLES = ("validation_id", "validation_ood")


def choose_on_validation(run, spec, cfg, build: Callable[[dict], Scorer]):
    """``(spec with the chosen hyperparameters, the sentence recorded with its rows)``; ``build(hp)``
    is the run's scorer of ``spec`` with the explicit hyperparameters ``hp``."""
    for role in VALIDATION_ROLES:
        if role in run.errors or role not in run.feats:
            raise RuntimeError(run.errors.get(role, f"no {role} features for the hyperparameter search"))
    names = list(spec.search)
    best = None
    for values in product(*(spec.search[n] for n in names)):
        hp = {**spec.hyperparameters, **dict(zip(names, values))}
        scorer = build(hp)
        (row,) = fit_score_evaluate(scorer, scorer.train, run.feats["validation_id"], {"validation_ood": run.feats["validation_ood"]})
        if row["status"] != "ok":
            raise RuntimeError(row["error"])
        key = (row["fpr95"], -row["auroc"])
        if best is None or key < best[0]:
            best = (key, hp, dict(zip(names, values)))
    (fpr, neg_auc), hp, chosen = best
    grid = "; ".join(f"{n} in {spec.search[n]}" for n in names)
    sel = cfg.selection
    note = (
        f"validation: {', '.join(f'{k}={v}' for k, v in chosen.items())} chosen from {grid} by FPR@95 on "
        f"{sel.validation_id.name} vs {sel.validation_ood.name} (FPR@95 {100 * fpr:.1f}%, AUROC {-100 * neg_auc:.1f}%)"
    )
    return replace(spec, hyperparameters=hp, search={}), note
