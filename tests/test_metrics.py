import numpy as np
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

from oodeval.metrics import (
    accuracy,
    all_metrics,
    aupr_in,
    aupr_out,
    auroc,
    detection_error,
    fpr_at_tpr,
    fpr_ood_positive,
    tnr_at_tpr,
)

pytestmark = pytest.mark.numerics  # run again under other CPU kernels (docs/conventions.md#reproducibility)


def test_hand_computed_separated():
    assert fpr_at_tpr([3, 2, 1], [0]) == 0.0
    assert auroc([3, 2, 1], [0]) == 1.0
    assert detection_error([2, 3], [0, 1]) == 0.0


def test_hand_computed_single_ood_sample():
    ids = np.arange(20.0)  # k = ceil(0.95 * 20) = 19, threshold = 19th largest = 1.0
    assert fpr_at_tpr(ids, [4.5]) == 1.0
    assert fpr_at_tpr(ids, [0.5]) == 0.0
    assert fpr_at_tpr(ids, [1.0]) == 1.0  # a score equal to the threshold is accepted
    assert auroc(ids, [4.5]) == 15 / 20
    assert tnr_at_tpr(ids, [0.5]) == 1.0


def test_hand_computed_ties_and_constant_scores():
    assert auroc([1, 1], [1]) == 0.5
    assert fpr_at_tpr([1, 1], [1]) == 1.0
    assert detection_error([1, 1], [1]) == 0.5
    const = all_metrics(np.zeros(6), np.zeros(4))
    assert const["auroc"] == 0.5 and const["fpr95"] == 1.0 and const["detection_error"] == 0.5
    assert const["aupr_in"] == pytest.approx(6 / 10) and const["aupr_out"] == pytest.approx(4 / 10)
    # id [1, 2, 2] vs ood [2]: wins = 0.5 + 0.5 + 0 over 3 pairs
    assert auroc([1, 2, 2], [2]) == pytest.approx(1 / 3)


def test_detection_error_hand_computed():
    # thresholds: >=3: .5(.5)+0 = .25; >=2: .25+.25; >=1: .25+.5; >=0: .5; none: .5
    assert detection_error([0, 3], [1, 2]) == 0.25


@pytest.mark.parametrize("seed", range(6))
def test_against_sklearn_with_ties(seed):
    rng = np.random.default_rng(seed)
    n, m = rng.integers(5, 400, size=2)
    ids = rng.normal(1, 1, n).round(seed % 3)
    ood = rng.normal(0, 1, m).round(seed % 3)
    y = np.r_[np.ones(n), np.zeros(m)]
    s = np.r_[ids, ood]
    fpr, tpr, _ = roc_curve(y, s, drop_intermediate=False)
    got = all_metrics(ids, ood)
    assert got["auroc"] == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    assert got["fpr95"] == pytest.approx(fpr[np.argmax(tpr >= 0.95)], abs=1e-12)
    assert got["tnr95"] == pytest.approx(1 - got["fpr95"], abs=1e-12)
    assert got["aupr_in"] == pytest.approx(average_precision_score(y, s), abs=1e-12)
    assert got["aupr_out"] == pytest.approx(average_precision_score(1 - y, -s), abs=1e-12)
    assert got["detection_error"] == pytest.approx(np.min(0.5 * (1 - tpr) + 0.5 * fpr), abs=1e-12)
    assert aupr_in(ids, ood) == got["aupr_in"] and aupr_out(ids, ood) == got["aupr_out"]
    for rate in (0.8, 0.9, 0.99):
        assert fpr_at_tpr(ids, ood, rate) == pytest.approx(fpr[np.argmax(tpr >= rate)], abs=1e-12)


def test_fpr_definition_matches_sorted_rule():
    rng = np.random.default_rng(1)
    for n in (1, 7, 20, 100, 101, 1999):
        ids, ood = rng.normal(size=n), rng.normal(size=50)
        d = np.sort(ids)[::-1]
        t = d[int(np.ceil(0.95 * n)) - 1]
        assert fpr_at_tpr(ids, ood) == np.mean(ood >= t)


def test_openood_fpr_has_its_own_name():
    rng = np.random.default_rng(2)
    ids, ood = rng.normal(1, 1, 300), rng.normal(0, 1, 200)
    y = np.r_[np.zeros(300), np.ones(200)]
    fpr, tpr, _ = roc_curve(y, -np.r_[ids, ood], drop_intermediate=False)
    assert fpr_ood_positive(ids, ood) == pytest.approx(fpr[np.argmax(tpr >= 0.95)], abs=1e-12)
    assert fpr_ood_positive(ids, ood) != fpr_at_tpr(ids, ood)


@pytest.mark.parametrize(
    "bad, pattern",
    [
        ([1.0, np.nan, np.nan], "2 non-finite values of 3 \\(2 NaN, 0 inf\\)"),
        ([1.0, np.inf], "1 non-finite values of 2 \\(0 NaN, 1 inf\\)"),
        ([], "empty"),
        ([[1.0, 2.0]], "1-d array"),
    ],
)
def test_bad_input_is_named(bad, pattern):
    with pytest.raises(ValueError, match="id_scores.*" + pattern):
        all_metrics(bad, [0.0])
    with pytest.raises(ValueError, match="ood_scores"):
        auroc([0.0], bad)


def test_accuracy_top1_and_multilabel():
    logits = np.array([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1], [0.2, 0.3, 0.5], [0.0, 0.0, 1.0]])
    assert accuracy(logits, [1, 0, 0, 2]) == 0.75
    assert accuracy(logits, [1, 0, -1, 2]) == 1.0  # -1 = no label, excluded
    assert accuracy(np.array([1, 0, 2, 2]), [{1, 2}, {1}, {0, 2}, set()]) == pytest.approx(2 / 3)
    mat = np.array([[0, 1, 1], [0, 1, 0], [1, 0, 1], [0, 0, 0]], dtype=bool)
    assert accuracy(logits, mat) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="shape"):
        accuracy(logits, [1, 0])
    with pytest.raises(ValueError, match="no sample has a valid label"):
        accuracy(logits, [set(), set(), set(), set()])


def test_metrics_command_names_bad_files_few_draws_and_what_it_resamples(tmp_path, capsys):
    from oodeval.cli import main

    rng = np.random.default_rng(0)
    np.save(tmp_path / "id.npy", rng.normal(1, 1, 300))
    np.save(tmp_path / "ood.npy", rng.normal(0, 1, 200))
    np.savez(tmp_path / "ood.npz", scores=rng.normal(0, 1, 200))
    (tmp_path / "ood.csv").write_text("score\n0.5\n0.1\n")
    np.save(tmp_path / "two.npy", np.zeros((5, 2)))
    ids = str(tmp_path / "id.npy")
    for name, says in (("ood.npz", "is a .npz archive; expected a .npy file"), ("ood.csv", "ood.csv: could not convert"),
                       ("two.npy", "holds a float64 array of shape (5, 2); expected")):  # fmt: skip
        assert main(["metrics", ids, str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert says in err and "one number per line and no header" in err, err
    assert main(["metrics", ids, str(tmp_path / "ood.npy"), "--draws", "20"]) == 2
    assert "--draws 20 is too few" in capsys.readouterr().err
    assert main(["metrics", ids, str(tmp_path / "ood.npy"), "--draws", "200"]) == 0
    out = capsys.readouterr().out
    assert "OOD scores resampled, ID scores and their FPR@95 threshold fixed" in out
    assert "aupr_in" in out and "(no interval: precision-recall areas are not bootstrapped)" in out
    assert main(["metrics", ids, str(tmp_path / "ood.npy"), "--draws", "200", "--resample-id"]) == 0
    assert "ID and OOD scores both resampled" in capsys.readouterr().out
