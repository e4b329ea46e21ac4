"""The cross-machine golden on fixed features (tests/golden.py): every paper detector's scores and
metrics on the quick demo's stored features agree with the committed ones within tolerances that
follow from the arithmetic, on any CPU kernel and thread count; a real regression fails it."""

import numpy as np
import pytest

import golden

pytestmark = pytest.mark.numerics


@pytest.fixture(scope="module")
def features():
    return golden.load_features()


@pytest.fixture(scope="module")
def recorded():
    return golden.load_feature_golden()


@pytest.fixture(scope="module")
def scored(features):
    return golden.score_features(*features)


def test_every_score_and_metric_within_its_tolerance(features, recorded, scored):
    cells, scores = scored
    assert set(cells) == set(recorded[0]) and set(scores) == set(recorded[1])
    assert golden.feature_deviation(cells, scores, *recorded, golden.reduction_length(features[0])) == []


def test_scoring_twice_gives_the_same_bytes(features, scored):
    """Determinism on one machine: the same inputs and seed, the same bytes (no tolerance)."""
    cells, scores = golden.score_features(*features, names=["vim", "knn", "nac"])
    for key, value in scores.items():
        assert np.array_equal(value, scored[1][key]), key
    for key, value in cells.items():
        assert value == scored[0][key], key


@pytest.mark.parametrize("regression", ["energy temperature 1.1", "knn k + 1", "one OOD row dropped"])
def test_a_regression_fails_the_golden(features, recorded, regression):
    train, nac_fit, test, oods = features
    if regression == "energy temperature 1.1":
        cells, scores = golden.score_features(train, nac_fit, test, oods, {"energy": {"temperature": 1.1}}, names=["energy"])
    elif regression == "knn k + 1":
        k = golden.default_hyperparameters(train)["knn"]["k"]
        cells, scores = golden.score_features(train, nac_fit, test, oods, {"knn": {"k": k + 1}}, names=["knn"])
    else:
        first = next(iter(oods))
        oods = {**oods, first: oods[first].subset(slice(1, None))}
        cells, scores = golden.score_features(train, nac_fit, test, oods, names=["msp"])
    problems = golden.feature_deviation(cells, scores, *recorded, golden.reduction_length(train))
    assert problems, f"{regression} passed the golden"
