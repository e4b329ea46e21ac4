import numpy as np
import pytest
from scipy.stats import spearmanr

from oodeval.metrics import all_metrics, auroc, detection_error, fpr_at_tpr
from oodeval.stats import (
    _collapsed_bins,
    bootstrap,
    confidence_interval,
    mean_std,
    rank_stability,
    standard_error,
    subsample,
)
from oodeval.metrics import _auroc_from_counts, _detection_error_from_counts, _fpr_from_counts


def _scores(seed, k=4, n=300, m=120, rounding=1):
    rng = np.random.default_rng(seed)
    shift = np.linspace(0.5, 2.0, k)[:, None]
    return rng.normal(shift, 1, (k, n)).round(rounding), rng.normal(0, 1, (k, m)).round(rounding)


def test_standard_error_closed_form():
    assert standard_error(0.5, 100) == pytest.approx(0.05)
    assert standard_error(0.8, 655) == pytest.approx(np.sqrt(0.8 * 0.2 / 655))
    fpc = np.sqrt((5879 - 655) / (5879 - 1))
    assert standard_error(0.3, 655, population=5879) == pytest.approx(np.sqrt(0.3 * 0.7 / 655) * fpc)
    assert standard_error(0.3, 50, population=50) == 0.0
    with pytest.raises(ValueError, match="smaller than the draw size"):
        standard_error(0.3, 50, population=10)


def test_subsample_matches_plain_loop():
    x, y = _scores(0)
    res = subsample(x, y, n=40, draws=25, seed=3)
    assert res.fpr.shape == res.auroc.shape == (4, 25)
    for b in range(25):
        idx = res.indices[b]
        assert np.unique(idx).size == 40  # without replacement
        for k in range(4):
            assert res.fpr[k, b] == pytest.approx(fpr_at_tpr(x[k], y[k, idx]), abs=1e-12)
            assert res.auroc[k, b] == pytest.approx(auroc(x[k], y[k, idx]), abs=1e-12)
    for k in range(4):
        assert res.full_fpr[k] == pytest.approx(fpr_at_tpr(x[k], y[k]))
        assert res.full_auroc[k] == pytest.approx(auroc(x[k], y[k]))
    again = subsample(x, y, n=40, draws=25, seed=3)
    assert np.array_equal(again.fpr, res.fpr) and np.array_equal(again.indices, res.indices)


def test_subsample_unbiased_with_finite_population_std():
    rng = np.random.default_rng(5)
    x, y = rng.normal(1, 1, 2000), rng.normal(0, 1, 1500)
    res = subsample(x, y, n=300, draws=4000, seed=0)
    assert abs(res.fpr.mean() - res.full_fpr[0]) < 0.005
    assert res.fpr.std() == pytest.approx(res.closed_form_std()[0], rel=0.08)


def test_rank_stability_matches_scipy_loop():
    x, y = _scores(1, k=6)
    res = subsample(x, y, n=30, draws=40, seed=0)
    ref = np.mean([spearmanr(res.fpr[:, b], res.full_fpr).statistic for b in range(40)])
    assert rank_stability(res.fpr, res.full_fpr) == pytest.approx(ref, abs=1e-12)
    with pytest.raises(ValueError, match="at least two"):
        rank_stability(res.fpr[:1], res.full_fpr[:1])


def test_bootstrap_fixed_id_matches_plain_loop():
    x, y = _scores(2)
    boot = bootstrap(x, y, draws=20, seed=1)
    for b in range(20):
        idx = boot["ood_index"][b]
        for k in range(4):
            ref = all_metrics(x[k], y[k, idx])
            for name in ("fpr95", "tnr95", "auroc", "detection_error"):
                assert boot[name][k, b] == pytest.approx(ref[name], abs=1e-12), name


def test_collapsed_bins_keep_the_metrics_exact():
    x, y = _scores(3, k=1, rounding=2)
    I, O = _collapsed_bins(x[0], y[0])
    assert I.size < x.size + y.size
    ref = all_metrics(x[0], y[0])
    assert _fpr_from_counts(I, O, 0.95) == pytest.approx(ref["fpr95"], abs=1e-12)
    assert _auroc_from_counts(I, O) == pytest.approx(ref["auroc"], abs=1e-12)
    assert _detection_error_from_counts(I, O) == pytest.approx(ref["detection_error"], abs=1e-12)


def test_bootstrap_resampling_both_matches_plain_loop_in_distribution():
    x, y = _scores(4, k=1, n=200, m=80)
    boot = bootstrap(x, y, draws=3000, seed=0, fixed_id=False)
    rng = np.random.default_rng(99)
    ref = {"auroc": [], "fpr95": [], "detection_error": []}
    for _ in range(3000):
        xi = x[0, rng.integers(0, 200, 200)]
        yi = y[0, rng.integers(0, 80, 80)]
        ref["auroc"].append(auroc(xi, yi))
        ref["fpr95"].append(fpr_at_tpr(xi, yi))
        ref["detection_error"].append(detection_error(xi, yi))
    for name, vals in ref.items():
        vals = np.asarray(vals)
        assert boot[name][0].mean() == pytest.approx(vals.mean(), abs=3 * vals.std() / np.sqrt(1500))
        assert boot[name][0].std() == pytest.approx(vals.std(), rel=0.1)


def test_confidence_interval_and_mean_std():
    draws = np.arange(1001, dtype=float)
    lo, hi = confidence_interval(draws)
    assert lo == pytest.approx(25.0) and hi == pytest.approx(975.0)
    out = mean_std([[1.0, 2.0], [3.0, 4.0], [5.0, 9.0]])
    assert out["ddof"] == 1 and out["n"] == 3
    assert np.allclose(out["mean"], [3.0, 5.0]) and np.allclose(out["std"], [2.0, np.std([2, 4, 9], ddof=1)])
    with pytest.raises(ValueError, match="ddof=1"):
        mean_std([1.0])


def test_bad_input():
    with pytest.raises(ValueError, match="3 detectors but ood_scores has 2"):
        bootstrap(np.zeros((3, 5)), np.zeros((2, 5)))
    with pytest.raises(ValueError, match="draw size n=50"):
        subsample(np.zeros(10), np.zeros(20), n=50)
    with pytest.raises(ValueError, match="non-finite"):
        subsample(np.zeros(10), np.r_[np.zeros(19), np.nan], n=5)
