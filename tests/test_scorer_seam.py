"""The seam (oodeval.scorer_factory.build_scorer) resolves fitting rows, backbone defaults and the seed from
what a detector's class declares; one row definition (oodeval.results.result_row) refuses other columns."""

from __future__ import annotations

import numpy as np
import pytest

from oodeval.errors import StateError
from oodeval.features import FeatureSet
from oodeval.results import CellKey, result_row
from oodeval.scorer_factory import RunSets, build_scorer


def _tapped(n: int, model: str | None, seed: int, taps: tuple[str, ...] = ("layer3",)) -> FeatureSet:
    rng = np.random.default_rng(seed)
    extras = {f"nac/{t}": rng.normal(size=(n, 5)).astype(np.float32) for t in taps}
    meta = {"model": model} if model else {}
    return FeatureSet(features=rng.normal(size=(n, 4)).astype(np.float32), labels=np.arange(n) % 2, extras=extras, meta=meta)


def test_a_detector_that_declares_fits_on_gets_its_tapped_rows_sized_and_seeded_by_its_hyperparameters():
    train, test = FeatureSet(features=np.zeros((6, 4), np.float32), labels=np.arange(6) % 2, meta={"model": "resnet18"}), _tapped(8, "resnet18", 1)
    tapped = _tapped(10, "resnet18", 2)
    asked: list = []
    sets = RunSets(train, test, lambda size, seed: asked.append((size, seed)) or tapped)
    scorer = build_scorer("nac", {}, sets, seed=7)
    assert asked == [(1000, 7)]  # n_fit from the class's ResNet release default, the cell's seed
    assert scorer.train is tapped and scorer.hyperparameters == {"seed": 7} and scorer.backbone == "resnet"
    assert build_scorer("nac", {"seed": 3, "n_fit": 4}, sets, seed=7).hyperparameters == {"seed": 3, "n_fit": 4}  # explicit wins
    assert asked[-1] == (4, 3)
    assert build_scorer("msp", {}, sets, seed=7).train is train and not build_scorer("msp", {}, sets, seed=7).hyperparameters
    scores = scorer.fit(scorer.train).score(test)
    assert scores.shape == (8,) and np.isfinite(scores).all()


def test_the_backbone_defaults_follow_the_set_the_detector_fits_on():
    vit_rows = _tapped(10, "vit_tiny_patch16_224", 2, taps=("norm", "blocks.11.norm2"))
    vit_rows.meta.update(depth=12)
    sets = RunSets(_tapped(6, "vit_tiny_patch16_224", 0, taps=()), _tapped(8, "vit_tiny_patch16_224", 1, taps=("norm", "blocks.11.norm2")),
                   lambda size, seed: vit_rows)  # fmt: skip
    resolved = build_scorer("nac", {}, sets).detector.get_params()
    assert resolved["n_fit"] == 50000 and set(resolved["layer_params"]) == {"norm", "blocks.11.norm2"}
    without = build_scorer("nac", {}, RunSets(sets.train, sets.test)).detector.get_params()
    assert without["layer_params"] is None  # the train set records no taps: no per-layer defaults


def test_result_row_is_the_one_row_definition():
    scorer = build_scorer("msp", {}, RunSets(None, FeatureSet(features=np.zeros((3, 2), np.float32))))
    cell = {"ood": "far", "split": "all", "seed": 0, "status": "error", "error": "x"}
    score_row = result_row(cell, scorer, resolved=False)
    assert list(score_row)[:2] == ["detector", "ood"] and score_row["hyperparameters"] == "{}"
    key = CellKey("m", "", "msp", '{"temperature":2}', "far", "all", 0)
    table_row = result_row(cell, scorer, key, resolved=False)
    assert table_row["hyperparameters"] == '{"temperature":2}' and table_row["dataset"] == "far" and "ood" not in table_row
    with pytest.raises(StateError, match="not columns of a results table"):
        result_row(cell, scorer, key, resolved=False, fpr_at_95=0.1)
