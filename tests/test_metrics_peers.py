"""AUTC, the peers' AUPR (trapezoid) and AURC / AUGRC: equal to pytorch-ood 0.4, to OpenOOD's formula
and to hand-worked values; each assertion fails on the wrong convention."""

import numpy as np
import pytest
import torch
from pytorch_ood.metrics import functional as pood
from sklearn.metrics import auc, precision_recall_curve, roc_auc_score

from oodeval.errors import InputError
from oodeval.metrics import (
    all_metrics,
    aupr_in,
    aupr_in_trapezoid,
    aupr_out_trapezoid,
    augrc,
    aurc,
    autc,
    selective_metrics,
)
from oodeval.stats import bootstrap, bootstrap_selective

# float64 sums of at most ~100 terms of size <= 1: a rounding error far below 1e-12
TOL = 1e-12


def _score_sets(count: int = 40):
    rng = np.random.default_rng(7)
    for t in range(count):
        n, m = rng.integers(2, 40, size=2)
        x, y = rng.normal(1.0, 1.0, n), rng.normal(0.0, 1.0, m)
        if t % 2:  # half with heavy ties
            x, y = np.round(2 * x) / 2, np.round(2 * y) / 2
        yield x, y


def _openood_aupr(x, y):
    """OpenOOD evaluators/metrics.py: auc(recall, precision) of precision_recall_curve, ID (in) and OOD (out) positive."""
    s = np.r_[x, y]
    is_id = np.r_[np.ones(x.size), np.zeros(y.size)]
    p_in, r_in, _ = precision_recall_curve(is_id, s)
    p_out, r_out, _ = precision_recall_curve(1 - is_id, -s)
    return auc(r_in, p_in), auc(r_out, p_out)


def _pood_inputs(x, y):
    """pytorch-ood: outlier scores (higher = OOD), labels < 0 for OOD."""
    return torch.tensor(-np.r_[x, y]), torch.tensor(np.r_[np.zeros(x.size), -np.ones(y.size)])


def test_peers_aupr_equals_openood_and_pytorch_ood():
    differs = 0
    for x, y in _score_sets():
        want_in, want_out = _openood_aupr(x, y)
        scores, labels = _pood_inputs(x, y)
        assert aupr_in_trapezoid(x, y) == pytest.approx(want_in, abs=TOL)
        assert aupr_out_trapezoid(x, y) == pytest.approx(want_out, abs=TOL)
        assert aupr_in_trapezoid(x, y) == pytest.approx(float(pood.aupr(scores, labels, positive="id")), abs=TOL)
        assert aupr_out_trapezoid(x, y) == pytest.approx(float(pood.aupr(scores, labels, positive="ood")), abs=TOL)
        differs += abs(aupr_in(x, y) - want_in) > 1e-6
    assert differs > 10  # average precision (ours) is a different number: the names must not be swapped


def test_peers_aupr_hand_worked():
    # ID [3, 1], OOD [2]: PR points (ID positive) (r, p) = (0, 1), (1/2, 1), (1/2, 1/2), (1, 2/3)
    # trapezoid = 1/2 * 1 + 0 + 1/2 * (1/2 + 2/3) / 2 = 0.5 + 7/24; average precision = 1/2 * 1 + 1/2 * 2/3
    assert aupr_in_trapezoid([3, 1], [2]) == pytest.approx(0.5 + 7 / 24, abs=TOL)
    assert aupr_in([3, 1], [2]) == pytest.approx(0.5 + 1 / 3, abs=TOL)
    # an OOD score on top: the first point has precision 0, so the trapezoid from (0, 1) is not taken
    assert aupr_in_trapezoid([1], [2]) == pytest.approx(0.5 * (0 + 0.5), abs=TOL)


def test_autc_equals_pytorch_ood():
    for x, y in _score_sets():
        scores, labels = _pood_inputs(x, y)
        assert autc(x, y) == pytest.approx(float(pood.autc(scores, labels)), abs=TOL)
        assert all_metrics(x, y)["autc"] == autc(x, y)


def test_autc_hand_worked_and_sign():
    # scores 0..4, ID [4, 2], OOD [1, 0]: normalised ID-ness s = v / 4; (mean_ID(1 - s) + mean_OOD(s)) / 2
    assert autc([4, 2], [1, 0]) == pytest.approx(((0 + 0.5) / 2 + (0.25 + 0) / 2) / 2, abs=TOL)
    # perfect at the extremes: 0; the sign reversed (higher = OOD read as ID): 1
    assert autc([1, 1], [0, 0]) == 0.0
    assert autc([0, 0], [1, 1]) == 1.0
    with pytest.raises(InputError, match="AUTC is undefined"):
        autc([2, 2], [2])
    assert np.isnan(all_metrics([2, 2], [2])["autc"])


def test_aurc_augrc_hand_worked():
    # confidences 4 > 3 > 2 > 1, correctness R W R W: errors among the top k = 0, 1, 1, 2
    # AURC (Geifman et al.) = mean of the selective risks 0, 1/2, 1/3, 1/2
    s, c = [4, 3, 2, 1], [True, False, True, False]
    assert aurc(s, c) == pytest.approx((0 + 1 / 2 + 1 / 3 + 1 / 2) / 4, abs=TOL)
    # AUGRC (Traub et al.): generalised risk at coverage k/4 = errors / 4 = 0, 1/4, 1/4, 1/2 from (0, 0),
    # trapezoid = 1/4 * (0 + 0 + 1/8 + 1/4 + 3/8) = 3/16
    assert augrc(s, c) == pytest.approx(3 / 16, abs=TOL)
    # the score read the wrong way (errors on top) is worse on both
    assert aurc([1, 2, 3, 4], c) > aurc(s, c) and augrc([1, 2, 3, 4], c) > augrc(s, c)
    # a tie group enters at once: all four tied, risk 1/2 at full coverage, generalised risk line to 1/2
    assert aurc([1, 1, 1, 1], c) == pytest.approx(0.5, abs=TOL)
    assert augrc([1, 1, 1, 1], c) == pytest.approx(0.25, abs=TOL)
    assert selective_metrics(s, c) == {"aurc": aurc(s, c), "augrc": augrc(s, c)}


def test_augrc_closed_form_with_ties():
    """Traub et al.'s identity AUGRC = (1 - acc)(acc (1 - AUROC_f) + (1 - acc) / 2), AUROC_f of the
    confidence separating right (positive) from wrong, ties one half."""
    rng = np.random.default_rng(3)
    for _ in range(20):
        s = np.round(rng.normal(size=30) * 2) / 2
        c = rng.random(30) < 1 / (1 + np.exp(-s))
        if c.all() or not c.any():
            continue
        acc = c.mean()
        want = (1 - acc) * (acc * (1 - roc_auc_score(c, s)) + (1 - acc) / 2)
        assert augrc(s, c) == pytest.approx(want, abs=TOL)


def test_selective_input_errors():
    with pytest.raises(InputError, match="one entry per ID score"):
        aurc([1, 2, 3], [True, False])
    with pytest.raises(InputError, match="booleans"):
        augrc([1, 2], [0, 2])


def test_bootstrap_new_metrics():
    rng = np.random.default_rng(0)
    x, y = rng.normal(1, 1, 200), rng.normal(0, 1, 80)
    for fixed in (True, False):
        draws = bootstrap(x, y, draws=300, seed=1, fixed_id=fixed)["autc"][0]
        assert draws.shape == (300,) and np.isfinite(draws).all()
        assert np.quantile(draws, 0.025) < autc(x, y) < np.quantile(draws, 0.975)
    c = rng.random(200) < 0.8
    sel = bootstrap_selective(x, c, draws=300, seed=1)
    for name, value in selective_metrics(x, c).items():
        assert np.quantile(sel[name], 0.025) < value < np.quantile(sel[name], 0.975)
    assert np.array_equal(bootstrap_selective(x, c, draws=50, seed=4)["aurc"], bootstrap_selective(x, c, draws=50, seed=4)["aurc"])


def test_bootstrap_autc_draw_is_autc_of_its_resample():
    rng = np.random.default_rng(2)
    x, y = rng.normal(1, 1, 30), rng.normal(0, 1, 20)
    boot = bootstrap(x, y, draws=5, seed=0, fixed_id=True)
    for d in range(5):
        assert boot["autc"][0, d] == pytest.approx(autc(x, y[boot["ood_index"][d]]), abs=TOL)


def test_metrics_command_carries_the_new_metrics(tmp_path, capsys):
    import json

    from oodeval.cli import main

    rng = np.random.default_rng(4)
    x, y, c = rng.normal(1, 1, 120), rng.normal(0, 1, 50), (rng.random(120) < 0.7).astype(int)
    for name, v in (("id", x), ("ood", y), ("ok", c)):
        np.save(tmp_path / f"{name}.npy", v)
    args = ["metrics", str(tmp_path / "id.npy"), str(tmp_path / "ood.npy"), "--draws", "200", "--id-correct", str(tmp_path / "ok.npy")]
    assert main([*args, "--format", "json"]) == 0
    row = json.loads(capsys.readouterr().out)[0]
    scores, labels = _pood_inputs(x, y)
    assert row["autc"] == pytest.approx(float(pood.autc(scores, labels)), abs=TOL)
    assert row["aupr_in_trapezoid"] == pytest.approx(_openood_aupr(x, y)[0], abs=TOL)
    assert row["aurc"] == aurc(x, c.astype(bool)) and row["augrc"] == augrc(x, c.astype(bool))
    assert row["autc_lo"] <= row["autc"] <= row["autc_hi"] and row["aurc_lo"] <= row["aurc"] <= row["aurc_hi"]
    assert main([*args, "--convention", "openood"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert names[:5] == ["fpr95_ood_positive", "fpr95", "auroc", "aupr_in_trapezoid", "aupr_out_trapezoid"]
    assert "aurc" in names and "augrc" in names


def test_bootstrap_selective_draw_is_the_metric_of_its_resample():
    rng = np.random.default_rng(6)
    x, c = np.round(rng.normal(size=150), 1), rng.random(150) < 0.7  # ties: duplicates join their group
    boot = bootstrap_selective(x, c, draws=3, seed=9)
    idx = np.random.default_rng(9).integers(0, 150, size=(3, 150))  # the draws bootstrap_selective makes (one block)
    for d in range(3):
        assert boot["aurc"][d] == pytest.approx(aurc(x[idx[d]], c[idx[d]]), abs=TOL)
        assert boot["augrc"][d] == pytest.approx(augrc(x[idx[d]], c[idx[d]]), abs=TOL)
