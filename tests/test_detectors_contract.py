"""oodeval.testing.check_detector on every registered detector, and that it catches broken ones."""

import numpy as np
import pytest

from oodeval import detectors
from oodeval.detectors.base import Detector
from oodeval.params import POSITIVE, Interval, Real
from oodeval.testing import check_detector, network_problem

#: the small problem has 200 train rows (5 classes): kNN's paper k=1000, NAC's ImageNet-sized
#: fitting defaults and kernel PCA's 4096 random features (a 4096-d eigendecomposition per fit) do not fit it
SMALL_HP = {"knn": {"k": 5}, "nac": {"n_fit": None}, "kpca": {"n_features": 64}}


@pytest.mark.parametrize("name", detectors.names())
def test_every_registered_detector_follows_the_contract(name):
    # the methods that need the network read their extraction passes' arrays (synthetic here)
    problem = network_problem() if "network" in detectors.REGISTRY.tags_of(name) else None
    check_detector(detectors.REGISTRY[name], SMALL_HP.get(name), problem=problem)


class _Stateful(Detector):
    """Keeps a running offset across fits: refitting changes its scores (the rule it breaks)."""

    needs = fit_needs = ("features",)
    constraints = {"scale": POSITIVE}

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale

    def _fit(self, train):
        type(self).calls = getattr(type(self), "calls", 0) + 1
        self.offset_ = float(type(self).calls)

    def _score(self, x):
        return self.scale * np.asarray(x.features, np.float64).sum(axis=1) + self.offset_


class _Mangles(Detector):
    """Changes its hyperparameter in the constructor."""

    needs = ("logits",)
    constraints = {"temperature": POSITIVE}

    def __init__(self, temperature: float = 1.0) -> None:
        self.temperature = float(temperature) * 2

    def _score(self, x):
        return np.asarray(x.logits, np.float64).max(axis=1) / self.temperature


class _Float32(Detector):
    """Returns float32 scores, bypassing the base class's cast."""

    needs = ("logits",)

    def score(self, x):
        return np.asarray(x.logits, np.float32).max(axis=1)


class _Undeclared(Detector):
    """Takes a hyperparameter without declaring its constraint."""

    needs = ("logits",)

    def __init__(self, temperature: float = 1.0) -> None:
        self.temperature = temperature

    def _score(self, x):
        return np.asarray(x.logits, np.float64).max(axis=1) / self.temperature


class _AcceptsAnything(_Undeclared):
    """Declares a constraint but skips the check (check_params overridden)."""

    constraints = {"temperature": POSITIVE}

    def check_params(self) -> None:
        return None


class _BadDefault(_Undeclared):
    """Its default breaks its own declaration."""

    constraints = {"temperature": Interval(Real, 2, None)}


@pytest.mark.parametrize("cls, rule", [(_Stateful, "refitting on the same rows changed the scores"),
                                       (_Mangles, "changed the default of temperature"),
                                       (_Float32, "score before fit"),
                                       (_Undeclared, "declares no constraint for temperature"),
                                       (_AcceptsAnything, r"_AcceptsAnything\(temperature='abc'\): no InputError raised"),
                                       (_BadDefault, "own defaults break its declared constraints")])  # fmt: skip
def test_check_detector_names_the_broken_rule(cls, rule):
    with pytest.raises(AssertionError, match=rule):
        check_detector(cls)
