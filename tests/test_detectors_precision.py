"""float32 fast path vs the float64 path, and the torch backend (on CPU) vs numpy."""

import numpy as np
import pytest
from scipy.stats import spearmanr

from oodeval import detectors
from oodeval.detectors._backend import Compute
from oodeval.detectors._synthetic import CONDITIONED, conditioned_problem, synthetic_problem
from oodeval.errors import InputError
from oodeval.features import FeatureSet
from oodeval.metrics import all_metrics

pytestmark = pytest.mark.numerics  # run again under other CPU kernels (docs/conventions.md#reproducibility)

#: every detector with a compute_dtype hyperparameter: all but maxlogit (a max is exact), nac (its own
#: per-layer states), cnc (one logit of a K+1 head) and the peers' methods that are float64 throughout
PRECISION = [n for n in detectors.names() if n not in ("nac", "maxlogit", "cnc") and "compute_dtype" in detectors.create(n).get_params()]
#: every one of them takes a device too (docs/conventions.md)
TORCH = PRECISION
#: smaller settings where a default costs only time: WeiPer's 100 perturbed heads (10 here)
HP = {"knn": {"k": 20}, "weiper": {"n_repeats": 10}}


@pytest.fixture(scope="module")
def problem():
    # C = 20 classes, D = 192: products long enough for float32 rounding to show
    return synthetic_problem(n_classes=20, dim=192, n_train=2000, n_test=400, n_ood=400, seed=3, nac=False)


def scores(name, problem, **hp):
    train, test, ood = problem
    det = detectors.create(name, **HP.get(name, {}), **hp).fit(train)
    return np.concatenate([det.score(test), det.score(ood)])


@pytest.mark.parametrize("name", PRECISION)
def test_float32_path_ranks_like_float64(problem, name):
    fast = scores(name, problem)
    ref = scores(name, problem, compute_dtype="float64")
    assert fast.dtype == np.float64
    assert spearmanr(fast, ref).statistic >= 0.99999
    assert not np.array_equal(fast, ref)  # the products really ran in float32


@pytest.fixture(scope="module", params=CONDITIONED)
def conditioned(request):
    return request.param, conditioned_problem(request.param)


@pytest.mark.parametrize("name", PRECISION)
def test_float32_agrees_with_float64_on_real_conditioning(conditioned, name):
    """Features conditioned like real ones (a LayerNorm-like offset with z'S^-1 z / D ~ 1e3, a
    covariance of condition number 1e8, fewer train rows than dimensions, a near-singular head):
    the float32 path ranks every score as float64 does, and FPR@95 / AUROC move by at most 0.1
    points (2 of the 2000 OOD rows). The expanded quadratic form z'Pz + mu'P mu - 2 z'P mu the
    Mahalanobis family used before fails this by up to 100 FPR@95 points (docs/performance.md)."""
    kind, (train, test, ood) = conditioned
    hp = {"knn": {"k": 20}, "nnguide": {"bank_fraction": 0.1}, "weiper": {"n_repeats": 10}}.get(name, {})
    got = {}
    for dtype in ("float32", "float64"):
        det = detectors.create(name, **hp, compute_dtype=dtype).fit(train)
        got[dtype] = (det.score(test), det.score(ood))
    (a_id, a_ood), (b_id, b_ood) = got["float32"], got["float64"]
    assert spearmanr(np.concatenate([a_id, a_ood]), np.concatenate([b_id, b_ood])).statistic >= 0.9999
    fast, ref = all_metrics(a_id, a_ood), all_metrics(b_id, b_ood)
    assert abs(fast["fpr95"] - ref["fpr95"]) <= 0.001 + 1e-12
    assert abs(fast["auroc"] - ref["auroc"]) <= 0.001


#: registered methods the conditioned problems cannot run: nac (per-layer states), cnc (a K + 1
#: head) and those needing the network (their passes' arrays, tests/test_network_methods.py)
NOT_ON_CONDITIONED = ["nac", "cnc", "odin", "mahalanobis_ensemble", "gram", "rankfeat", "mc_dropout", "deep_ensemble", "adascale_a",
                      "adascale_l", "iodin"]  # fmt: skip
#: the methods without a float32 path that run on cached arrays: float64 whatever the input
FLOAT64_ONLY = [n for n in detectors.names() if n not in NOT_ON_CONDITIONED and "compute_dtype" not in detectors.create(n).get_params()]
#: a smaller setting where the default's fit is large for a test (kernel PCA: 4096 random features)
SMALL = {"kpca": {"n_features": 512}}


@pytest.mark.parametrize("name", FLOAT64_ONLY)
def test_float64_methods_score_float32_inputs_as_their_float64_copies(conditioned, name):
    """Every method without a compute_dtype computes in float64 whatever its input: on each
    conditioned problem its scores of the float32 arrays are those of their exact float64 copies
    (the same code on the same values in one process: equal bits), and finite."""
    kind, (train, test, ood) = conditioned

    def widened(fs):
        return FeatureSet(fs.features.astype(np.float64), labels=fs.labels, logits=None if fs.logits is None else fs.logits.astype(np.float64),
                          weight=None if fs.weight is None else fs.weight.astype(np.float64), bias=None if fs.bias is None else fs.bias.astype(np.float64))  # fmt: skip

    det = detectors.create(name, **SMALL.get(name, {})).fit(train)
    wide = detectors.create(name, **SMALL.get(name, {})).fit(widened(train))
    for fs in (test, ood):
        got = det.score(fs)
        assert np.isfinite(got).all()
        np.testing.assert_array_equal(got, wide.score(widened(fs)))


def test_the_conditioned_problems_cover_every_method():
    covered = set(PRECISION) | set(FLOAT64_ONLY) | set(NOT_ON_CONDITIONED)
    assert covered == set(detectors.names())
    assert not set(PRECISION) & set(FLOAT64_ONLY)


@pytest.mark.parametrize("name", ["cfood", "optfs", "kpca"])
def test_float64_since_paper_methods_hold_on_real_conditioning(conditioned, name):
    """The since-paper methods that are float64 throughout (CFOOD's scores are grid values a
    flipped comparison moves a whole step; OptFS bins every feature value; kernel PCA's residual
    space is its scatter's smallest eigenvalues, with 512 random features here): on each conditioned
    problem each ranks as its release re-derived (tests/test_since_paper.py) and FPR@95 / AUROC
    move by at most 0.1 points."""
    from test_since_paper import _cfood_release, _kpca_release, _optfs_release

    kind, (train, test, ood) = conditioned
    det = detectors.create(name, **SMALL.get(name, {})).fit(train)
    ours = np.concatenate([det.score(test), det.score(ood)])
    if name == "kpca":
        rows = np.concatenate([test.features, ood.features])
        ref = _kpca_release(train.features, rows, 0.5, det.rff_weights_, det.rff_phases_)
    elif name == "cfood":
        ref = _cfood_release(np.asarray(train.features)[det.reference_index_], np.concatenate([test.features, ood.features]), 0.01)
    else:
        ref = np.concatenate([_optfs_release(train, test), _optfs_release(train, ood)])
    assert spearmanr(ours, ref).statistic >= 0.9999
    a, b = all_metrics(ours[: len(test)], ours[len(test) :]), all_metrics(ref[: len(test)], ref[len(test) :])
    assert abs(a["fpr95"] - b["fpr95"]) <= 0.001 + 1e-12
    assert abs(a["auroc"] - b["auroc"]) <= 0.001


def test_conditioned_problems_are_conditioned_as_stated():
    """The generator's claims, so the test above cannot pass on an easy problem."""
    from oodeval.detectors._common import class_means, scatter

    for kind in CONDITIONED:
        train = conditioned_problem(kind)[0]
        classes = np.unique(train.labels)
        means, _ = class_means(train.features, train.labels, classes)
        s, n = scatter(train.features, means, train.labels, classes)
        evals = np.linalg.eigvalsh(s / n)
        z = train.features.astype(np.float64)
        if kind == "offset":  # the cancelled-term ratio of the expanded form
            ratio = np.einsum("nd,de,ne->n", z, np.linalg.pinv(s / n, hermitian=True), z).mean() / z.shape[1]
            assert ratio > 1e3
        if kind == "tail":
            assert evals.max() / evals[evals > 0].min() > 1e7
        if kind == "rank_deficient":
            assert len(z) < z.shape[1]
        if kind == "head":
            sv = np.linalg.svd(train.weight.astype(np.float64), compute_uv=False)
            assert sv.min() / sv.max() < 1e-3


@pytest.mark.parametrize("name", TORCH)
def test_torch_backend_matches_numpy(problem, name):
    # float64 on both backends: the same formula, so agreement to float64 rounding
    ref = scores(name, problem, compute_dtype="float64")
    got = scores(name, problem, compute_dtype="float64", device="cpu")
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-9 * np.abs(ref).max())
    # float32 on torch ranks like the float64 reference
    fast = scores(name, problem, device="cpu")
    assert spearmanr(fast, ref).statistic >= 0.99999


def test_torch_backend_is_chunked(problem, monkeypatch):
    from oodeval.detectors import _backend

    ref = scores("mahalanobis", problem, compute_dtype="float64", device="cpu")
    monkeypatch.setattr(_backend, "TORCH_CHUNK_ELEMENTS", 1000)  # 256 rows per chunk: 8 chunks of train
    assert Compute(device="cpu").rows(192) == 256
    got = scores("mahalanobis", problem, compute_dtype="float64", device="cpu")
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-9 * np.abs(ref).max())


def test_exact_knn_with_small_blocks(problem, monkeypatch):
    from oodeval.detectors import neighbours

    train, test, _ = problem
    z = train.features / np.linalg.norm(train.features, axis=1, keepdims=True)
    q = test.features / np.linalg.norm(test.features, axis=1, keepdims=True)
    kth = np.sort(q.astype(np.float64) @ z.T.astype(np.float64), axis=1)[:, -20]
    monkeypatch.setattr(neighbours, "BLOCK_ROWS", {False: 300, True: 300})  # 7 blocks, merged top-k
    for device in (None, "cpu"):
        got = detectors.create("knn", k=20, device=device).fit(train).score(test)
        np.testing.assert_allclose(got, -np.sqrt(np.maximum(2 - 2 * kth, 0)), rtol=1e-5, atol=1e-6)


def test_exactly_the_documented_detectors_lack_compute_dtype_and_device():
    params = {n: detectors.create(n).get_params() for n in detectors.names()}
    lacking = [n for n, p in params.items() if "compute_dtype" not in p]
    assert [n for n, p in params.items() if "device" not in p] == lacking  # compute_dtype and device come together
    float64 = ["class_gmm", "gmm", "grad_uncertainty", "cfood", "optfs", "kpca"]
    network = ["odin", "mahalanobis_ensemble", "gram", "rankfeat", "mc_dropout",  # on their passes' arrays (detectors.network)
               "deep_ensemble", "adascale_a", "adascale_l", "iodin"]  # fmt: skip
    assert sorted(lacking) == sorted(["cnc", "maxlogit", "nac", *float64, *network])  # the peers' float64-only methods


def test_bad_compute_dtype_or_device_is_refused_when_built():
    with pytest.raises(InputError, match=r"detector 'mahalanobis': compute_dtype='float16' must be one of 'float32', 'float64'"):
        detectors.create("mahalanobis", compute_dtype="float16")
    with pytest.raises(InputError, match=r"detector 'knn': device='meta' must be a torch device \('cpu', 'cuda', 'cuda:N'\) or None"):
        detectors.create("knn", k=5, device="meta")


@pytest.mark.parametrize("name", PRECISION)
def test_the_old_name_precision_is_refused_with_its_new_name(name):
    with pytest.raises(InputError, match=f"detector '{name}': precision was renamed to compute_dtype; write compute_dtype instead"):
        detectors.create(name, precision="float64")
    with pytest.raises(InputError, match="precision was renamed to compute_dtype"):
        detectors.create(name).set_params(precision="float64")


@pytest.mark.parametrize("device", [None, "cpu"])
def test_row_helpers_agree_with_plain_numpy(device):
    from oodeval.detectors import _backend

    comp = Compute(device=device)
    eps = float(np.finfo(np.float32).eps) / 2  # float32 unit roundoff
    rng = np.random.default_rng(0)
    a = rng.normal(size=(3 * _backend.PARALLEL_ROWS + 7, 30)).astype(np.float32) * 5
    b = rng.normal(size=a.shape).astype(np.float32)
    a64 = a.astype(np.float64)
    # rowdot: at worst each float32 product rounded once (torch), the sum in float64
    err = np.abs(comp.get(comp.rowdot(comp.put(a), comp.put(b))) - (a64 * b).sum(axis=1))
    assert (err <= 2 * eps * np.abs(a64 * b).sum(axis=1)).all()
    err = np.abs(comp.get(comp.rowsum(comp.put(a))) - a64.sum(axis=1))
    assert (err <= 1e-12 * np.abs(a64).sum(axis=1)).all()
    # by_rows: a fn returning a tuple gives the tuple of the whole arrays' results
    m, e, total = comp.by_rows(comp.shifted_exp, comp.put(a))
    np.testing.assert_array_equal(comp.get(m), a.max(axis=1))
    shifted = a64 - a64.max(axis=1, keepdims=True)
    # exp(x) in float32 of x rounded to float32: relative error |x| eps + a few eps
    assert (np.abs(comp.get(e) - np.exp(shifted)) <= (np.abs(shifted) + 4) * eps * np.exp(shifted)).all()
    np.testing.assert_allclose(comp.get(total), comp.get(e).sum(axis=1), rtol=1e-12)
    out = comp.empty(a.shape)  # shifted_exp writes e where it is told
    assert comp.shifted_exp(comp.put(a), out)[1] is out
    # groupsum: weighted sums of the rows by group; the weights and products in float32 and,
    # with numpy, the sums of one chunk too: at most (n + 2) eps of the sum of |terms|
    group = rng.integers(0, 4, len(a))
    weights = rng.random(len(a))
    terms = [a64[group == g] * weights[group == g, None] for g in range(4)]
    got = comp.get(comp.groupsum(comp.put(a), group, 4, weights=weights))
    for g, t in enumerate(terms):
        assert (np.abs(got[g] - t.sum(axis=0)) <= (len(t) + 2) * eps * np.abs(t).sum(axis=0)).all()


def test_blas_thread_holds_nest_and_restore_the_setting():
    from oodeval._blas import controller as _blas
    from oodeval.detectors._backend import PARALLEL_ROWS, one_blas_thread

    threads = lambda: _blas().info()[0]["num_threads"]  # noqa: E731
    before = threads()
    first, second = one_blas_thread(), one_blas_thread()  # as two threads' holds would overlap
    first.__enter__()
    second.__enter__()
    assert threads() == 1
    first.__exit__(None, None, None)  # not in the order they began: still held by the second
    assert threads() == 1
    second.__exit__(None, None, None)
    assert threads() == before
    got = Compute().by_rows(lambda a: a @ np.ones((4, 2), dtype=np.float32), np.ones((3 * PARALLEL_ROWS, 4), dtype=np.float32))
    np.testing.assert_array_equal(got, np.full((3 * PARALLEL_ROWS, 2), 4.0))
    assert threads() == before


@pytest.mark.parametrize("overwrite", [False, True])
def test_softmax_sums_take_one_shift_per_block_and_a_row_its_own_where_needed(overwrite):
    """numpy's logsumexp and max_softmax shift a block by 0 (max <= UNSHIFTED_MAX) or by its
    max, and a row lying more than UNDERFLOW_MARGIN below that shift by its own max: each is the
    float64 value within the float32 exp's error, nothing overflows or underflows away, and a
    confident row keeps its distance to 1."""
    from scipy.special import logsumexp

    eps = float(np.finfo(np.float32).eps) / 2
    rng = np.random.default_rng(1)
    base = rng.normal(size=(6, 1000)) * 4
    # confident rows, 1 - p_max ~ 1e-6: a float32 total would round that to a multiple of 6e-8
    base[:, 0] = base[:, 1:].max(axis=1) + 20
    blocks = {  # row offsets: within reach of exp unshifted; above it; far below the block's shift
        "unshifted": [0, 30, -30, 45, -35, 5],
        "shifted": [200, 190, 150, 120, 170, 199],
        "own": [0, -100, -300, 10, -45, -1000],
    }
    comp = Compute()
    for offsets in blocks.values():
        a = (base + np.array(offsets, dtype=float)[:, None]).astype(np.float32)
        a64 = a.astype(np.float64)
        m = a64.max(axis=1, keepdims=True)
        # exp of x = a - s rounded to float32: relative error (|x| + 4) eps, s any of the shifts
        reach = np.max([np.abs(a64), np.abs(a64 - a64.max()), np.abs(a64 - m)], axis=(0, 2))
        bound = (reach + 4) * eps
        got = comp.logsumexp(a.copy(), overwrite=overwrite)
        assert (np.abs(got - logsumexp(a64, axis=1)) <= bound).all()
        rest = np.exp(a64[:, 1:] - m).sum(axis=1)  # sum over c != argmax of exp(a_c - max a)
        p = comp.max_softmax(a.copy(), overwrite=overwrite)
        assert (np.abs((1 / p - 1) - rest) <= 2 * bound * rest + 4 * np.finfo(float).eps).all()


def test_a_failing_block_raises_and_leaves_the_pool_usable():
    from oodeval.detectors._backend import PARALLEL_ROWS

    def fn(a):
        if a[0, 0] == 3 * PARALLEL_ROWS:
            raise ValueError("block 3")
        return a[:, 0]

    rows = np.arange(40 * PARALLEL_ROWS, dtype=np.float32)[:, None]
    with pytest.raises(ValueError, match="block 3"):
        Compute().by_rows(fn, rows)
    np.testing.assert_array_equal(Compute().by_rows(lambda a: a[:, 0] * 2, rows), rows[:, 0] * 2)


def test_mahalanobis_switches_to_float64_where_float32_cannot_hold(monkeypatch):
    """At condition number 1e13 the whitened rounding of z - m is too large for float32 (forced,
    rMaha++ ranks below Spearman 0.9999): the fit says so in resolved_params and scores exactly as
    the float64 path; at 1e8 it stays float32."""
    from oodeval.detectors import mahalanobis

    train, test, _ = conditioned_problem("tail", condition=1e13, n_test=1000, n_ood=10)
    ref = detectors.create("relative_mahalanobis_pp", compute_dtype="float64").fit(train).score(test)
    det = detectors.create("relative_mahalanobis_pp").fit(train)
    assert det.get_params()["compute_dtype"] == "float32" and det.resolved_params()["compute_dtype"] == "float64"
    np.testing.assert_array_equal(det.score(test), ref)
    monkeypatch.setattr(mahalanobis, "WHITENED_ROUNDING_LIMIT", np.inf)
    forced = detectors.create("relative_mahalanobis_pp").fit(train).score(test)
    assert spearmanr(forced, ref).statistic < 0.9999
    monkeypatch.undo()
    usual = detectors.create("relative_mahalanobis_pp").fit(conditioned_problem("tail")[0])
    assert usual.resolved_params()["compute_dtype"] == "float32"
