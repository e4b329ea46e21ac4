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


EPS32, EPS64 = np.finfo(np.float32).eps / 2, np.finfo(np.float64).eps


@pytest.mark.parametrize("normalise", [False, True])
def test_centred_class_means_equal_the_float64_ones(conditioned, normalise):
    """The float32 path's class means (float32 sums of rows less the first chunk's mean r, added
    into float64) against the float64 class means, on every conditioned problem: each mean moves
    by at most what the arithmetic allows. Per class c and column j, x_i = z_i - r (z_i / |z_i| - r
    for the ++ forms, formed in float64) is rounded once (eps32 / 2 of |x_ij|) and summed over at
    most n_c rows in float32 (recursive summation: at most (n_c - 1) eps32 / 2 of sum |x_ij|), so
    the mean errs by at most n_c eps32 / 2 mean_i |x_ij|, plus float64 roundings of the
    uncentred values. On ``offset`` a float32 sum of the raw rows would err by ulps of |z|,
    about 1e3 times that bound."""
    from oodeval.detectors._backend import Compute
    from oodeval.detectors._common import class_means

    kind, (train, _, _) = conditioned
    z, y = train.features.astype(np.float64), train.labels
    classes = np.unique(y[y >= 0])
    got, got_counts = mahalanobis._centred_class_means(train.features, y, classes, normalise, Compute("float32"))
    want, counts = class_means(train.features, y, classes, normalise, Compute("float64"))
    np.testing.assert_array_equal(got_counts, counts)
    if normalise:
        z = z / np.linalg.norm(z, axis=1, keepdims=True)
    first = next(Compute("float32").chunks(len(z), z.shape[1]))
    r = z[first][y[first] >= 0].mean(axis=0).astype(np.float32).astype(np.float64)
    for i, c in enumerate(classes):
        rows = z[y == c]
        n = len(rows)
        bound = n * EPS32 * np.abs(rows - r).mean(axis=0) * 1.01 + 8 * n * EPS64 * (np.abs(rows).mean(axis=0) + np.abs(r))
        assert np.all(np.abs(got[i] - want[i]) <= bound), (kind, c)


@pytest.mark.parametrize("name", FAMILY)
def test_whitened_means_are_one_float32_product_of_the_centred_means(conditioned, name):
    """nu_c = (mu_c - m) W on the float32 path: mu_c - m and W each rounded once to float32
    (eps32 / 2 of each entry) and one sgemm (at most D eps32 / 2 of sum_j |a_j W_jk| per entry,
    recursive summation), so each entry lies within (D + 2) eps32 / 2 sum_j |a_j| |W_jk| of the
    float64 product of the same fitted statistics; the float64 path forms it in float64."""
    kind, (train, _, _) = conditioned
    det = detectors.create(name).fit(train)
    a = det.means_ - det.center_
    want = a @ det.whitening_
    if det.resolved_params()["compute_dtype"] == "float64":
        np.testing.assert_array_equal(det.whitened_means_, want)
        return
    bound = (a.shape[1] + 2) * EPS32 * (np.abs(a) @ np.abs(det.whitening_)) * 1.01
    assert np.all(np.abs(det.whitened_means_ - want) <= bound)


@pytest.mark.parametrize("device", [None, "cpu"])
def test_centred_unit_rows_are_the_float64_normalised_rows_rounded_once(device):
    """The ++ forms' rows, z / |z| - m formed in float64 and rounded once to float32
    (Compute.centred_unit, in sub-blocks on numpy), against the float64 formula rounded to float32:
    within one float32 ulp of the result (the float64 steps agree to a few eps64 of 1, which can
    move a rounding by one ulp), on rows offset far from the origin (the ``offset`` problem), where
    a float32 normalisation errs by ulps of the normalised rows, beyond one ulp of the centred
    values on a large share of them."""
    from oodeval.detectors._backend import Compute

    pytest.importorskip("torch") if device else None
    z = conditioned_problem("offset")[0].features[:300]
    wide = z.astype(np.float64) / np.linalg.norm(z.astype(np.float64), axis=1, keepdims=True)
    centre = wide.mean(axis=0).astype(np.float32).astype(np.float64)
    want = (wide - centre).astype(np.float32)
    comp = Compute("float32", device)
    got = comp.host(comp.centred_unit(comp.put(z) if device else z, comp.put(centre, "float64")))
    assert got.dtype == np.float32
    assert np.all(np.abs(got.astype(np.float64) - want) <= np.spacing(np.abs(want)))
    naive = (z / np.linalg.norm(z, axis=1, keepdims=True) - centre.astype(np.float32)).astype(np.float32)
    assert np.mean(np.abs(naive.astype(np.float64) - (wide - centre)) > np.spacing(np.abs(want))) > 0.2
