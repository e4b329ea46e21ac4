"""``oodeval.evaluate()`` never returns a silent NaN: a failed cell raises (or, with
``errors="row"``, stays a row and warns), and impossible hyperparameters are refused with the
value, the limit and the detector before any work."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import oodeval
from oodeval import detectors
from oodeval.cli import main
from oodeval.detectors._synthetic import synthetic_problem


@pytest.fixture(scope="module")
def sets():
    train, test, ood = synthetic_problem(n_classes=4, dim=8, n_train=60, n_test=30, n_ood=20, seed=5)
    return train, test, ood


def test_k_above_the_training_set_raises_with_value_limit_and_detector(sets):
    train, test, ood = sets
    with pytest.raises(ValueError, match=r"1 of 2 \(detector, OOD set\) cells failed: knn / far: fit on the ID-train set: "
                                         r"detector 'knn': k=1000 exceeds the 60-sample bank \(60 train rows"):
        oodeval.evaluate(train=train, id=test, ood={"far": ood}, detectors=["msp", "knn"], draws=0)


def test_errors_row_keeps_the_row_and_warns_naming_it(sets):
    train, test, ood = sets
    with pytest.warns(UserWarning, match=r"oodeval.evaluate: knn / far: fit on the ID-train set: detector 'knn': k=1000 exceeds"):
        df = oodeval.evaluate(train=train, id=test, ood={"far": ood}, detectors=["msp", "knn"], draws=0, errors="row")
    knn = df[df["detector"] == "knn"].iloc[0]
    assert knn["status"] == "error" and np.isnan(knn["fpr95"]) and "k=1000" in knn["error"]
    assert df[df["detector"] == "msp"]["status"].tolist() == ["ok"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing failed: no warning
        ok = oodeval.evaluate(train=train, id=test, ood={"far": ood}, detectors=["knn"], hyperparameters={"knn": {"k": 5}}, draws=0)
    assert ok["status"].tolist() == ["ok"]
    with pytest.raises(ValueError, match="errors must be 'raise' or 'row'"):
        oodeval.evaluate(train=train, id=test, ood={"far": ood}, detectors=["msp"], errors="ignore")


def test_a_non_numeric_temperature_is_refused_at_construction(sets, tmp_path, capsys):
    train, test, ood = sets
    with pytest.raises(ValueError, match=r"detector 'msp': temperature='abc' must be a number > 0"):
        detectors.create("msp", temperature="abc")
    with pytest.raises(ValueError, match=r"detector 'energy': temperature=True must be a number > 0"):
        detectors.create("energy", temperature=True)
    with pytest.raises(ValueError, match=r"detector 'neco': maxlogit='yes' must be true or false"):
        detectors.create("neco", maxlogit="yes")
    with pytest.raises(ValueError, match=r"detector 'msp': temperature='abc' must be a number > 0"):
        oodeval.evaluate(train=train, id=test, ood={"far": ood}, detectors=["msp"], hyperparameters={"msp": {"temperature": "abc"}})
    for name, fs in (("train", train), ("test", test), ("far", ood)):
        fs.save(tmp_path / name)
    argv = ["score", "--train", str(tmp_path / "train"), "--test", str(tmp_path / "test"), "--ood", f"far={tmp_path / 'far'}",
            "--detectors", "msp", "--set", "msp.temperature=abc", "--no-progress"]  # fmt: skip
    assert main(argv) == 2
    assert "oodeval score: error: detector 'msp': temperature='abc' must be a number > 0" in capsys.readouterr().err
    assert detectors.create("msp", temperature=np.float32(2.0)).temperature == 2.0  # numpy numbers are numbers
