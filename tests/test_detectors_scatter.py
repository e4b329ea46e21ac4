"""The Mahalanobis family's float32 scatter (float32 products of class-centred blocks added into
float64) against the float64 scatter, on the conditioned problems of test_detectors_precision.py."""

import numpy as np
import pytest
from scipy.stats import spearmanr

from oodeval import detectors
from oodeval.detectors import mahalanobis
from oodeval.detectors._synthetic import CONDITIONED, conditioned_problem, synthetic_problem
from oodeval.metrics import all_metrics

pytestmark = pytest.mark.numerics  # run again under other CPU kernels (docs/conventions.md#reproducibility)

FAMILY = ["mahalanobis", "relative_mahalanobis", "mahalanobis_pp", "relative_mahalanobis_pp"]
#: the problems whose covariance a float32 scatter cannot resolve: condition number 1e8, and fewer
#: train rows than dimensions (exact zero eigenvalues, which float32 sums turn into noise)
FALLS_BACK = {"tail", "rank_deficient"}


@pytest.fixture(scope="module", params=CONDITIONED)
def conditioned(request):
    return request.param, conditioned_problem(request.param)


@pytest.fixture
def any_size(monkeypatch):
    """The float32 scatter tried on these small fits too (one chunk of rows, not the 4 it needs)."""
    monkeypatch.setattr(mahalanobis, "SCATTER_MIN_CHUNKS", 0)


def _pair(name, train, monkeypatch):
    """(the default fit, the same fit with its scatter forced to float64)."""
    fast = detectors.create(name).fit(train)
    with monkeypatch.context() as m:
        m.setattr(mahalanobis, "SCATTER_ROUNDING_LIMIT", -1.0)  # every float32 scatter is redone in float64
        ref = detectors.create(name).fit(train)
    assert ref.scatter_dtype_ == "float64"
    return fast, ref


def _squared(z, cov, centres):
    """float64 min over ``centres`` of (z - mu)' S^+ (z - mu), S^+ from S's own eigendecomposition
    (numpy's pinv cutoff), in whitened coordinates about the centres' mean (no float32 step)."""
    evals, evecs = np.linalg.eigh(cov)
    keep = evals > len(cov) * np.finfo(np.float64).eps * evals.max()
    w = evecs[:, keep] / np.sqrt(evals[keep])
    origin = centres.mean(axis=0)
    u, nu = (z - origin) @ w, (centres - origin) @ w
    return np.min((u**2).sum(1)[:, None] - 2 * u @ nu.T + (nu**2).sum(1)[None, :], axis=1)


def _distances(det, z):
    """min_c MD_c (and MD_0 for the relative forms) from the fitted covariances, in float64: what
    the fitted statistics say, apart from the scoring."""
    z = z.astype(np.float64)
    if det.normalise:
        z = z / np.linalg.norm(z, axis=1, keepdims=True)
    md = _squared(z, det.covariance_, det.means_)
    if not det.relative:
        return md, np.zeros_like(md)
    mean = det.counts_ @ det.means_ / det.counts_.sum()
    return md, _squared(z, det.background_covariance_, mean[None, :])


@pytest.mark.parametrize("name", FAMILY)
def test_float32_scatter_equals_the_float64_one_where_kept(conditioned, name, monkeypatch, any_size):
    """Where the fit keeps its float32 scatter (offset, head), the covariance read through the
    float64 whitening moves by less than the documented estimate (scatter_rounding_, 2e-3 at
    most), so does every distance, relatively (a whitened error e moves x'S^+x by at most a
    factor 1 + e / (1 - e)); the scores rank as the float64 scatter's and FPR@95 / AUROC move by
    at most 0.1 points. Where it cannot (tail, rank_deficient), it forms the float64 scatter and
    scores exactly as the forced float64 fit (the same code on the same values)."""
    kind, (train, test, ood) = conditioned
    fast, ref = _pair(name, train, monkeypatch)
    rows = np.concatenate([test.features, ood.features])
    got = np.concatenate([fast.score(test), fast.score(ood)])
    want = np.concatenate([ref.score(test), ref.score(ood)])
    if kind in FALLS_BACK:
        assert fast.scatter_dtype_ == "float64" and fast.scatter_rounding_ > mahalanobis.SCATTER_ROUNDING_LIMIT
        np.testing.assert_array_equal(got, want)
        return
    assert fast.scatter_dtype_ == "float32"
    bound = fast.scatter_rounding_
    assert bound <= mahalanobis.SCATTER_ROUNDING_LIMIT
    for cov, white in [(fast.covariance_, ref.whitening_)] + ([(fast.background_covariance_, ref.background_whitening_)] if fast.relative else []):
        ref_cov = ref.covariance_ if white is ref.whitening_ else ref.background_covariance_
        assert np.linalg.norm(white.T @ (cov - ref_cov) @ white) <= bound
    (md, md0), (ref_md, ref_md0) = _distances(fast, rows), _distances(ref, rows)
    factor = bound / (1 - bound)
    assert np.all(np.abs(md - ref_md) <= factor * ref_md)
    assert np.all(np.abs(md0 - ref_md0) <= factor * ref_md0)
    assert spearmanr(got, want).statistic >= 0.9999
    a, b = all_metrics(got[: len(test)], got[len(test) :]), all_metrics(want[: len(test)], want[len(test) :])
    assert abs(a["fpr95"] - b["fpr95"]) <= 0.001 + 1e-12
    assert abs(a["auroc"] - b["auroc"]) <= 0.001


def test_float64_compute_dtype_and_small_fits_form_the_float64_scatter():
    train = conditioned_problem("head")[0]  # 3000 rows of 256: one chunk
    assert detectors.create("mahalanobis", compute_dtype="float64").fit(train).scatter_dtype_ == "float64"
    small = detectors.create("mahalanobis").fit(train)
    assert small.scatter_dtype_ == "float64" and small.scatter_rounding_ is None


def test_well_conditioned_features_keep_the_float32_scatter(any_size):
    """Post-ReLU class-Gaussian features (benchmarks/detectors.py's problem, small): the fast path
    runs, so the tests above exercise the code that the benchmark times."""
    train = synthetic_problem(n_classes=20, dim=192, n_train=2000, n_test=10, n_ood=10, seed=3, nac=False)[0]
    for name in FAMILY:
        assert detectors.create(name).fit(train).scatter_dtype_ == "float32"
