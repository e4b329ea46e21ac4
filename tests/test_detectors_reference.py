"""Each detector against an independent, plain re-derivation of its paper's formula.

Small generated data; the library runs with tiny chunks so every chunked path is exercised.
References use loops, sklearn/scipy estimators and full sorts instead of the library's
matrix identities, partial sorts, histogram percentiles and blocked top-k neighbour search.
"""

import numpy as np
import pytest
from scipy.spatial.distance import cdist
from scipy.special import expit, logsumexp, softmax
from scipy.stats import entropy
from sklearn.covariance import EmpiricalCovariance
from sklearn.decomposition import PCA
from sklearn.preprocessing import StandardScaler

from oodeval import _arrays, detectors
from oodeval.detectors import _backend, _common, activation, hybrid
from oodeval.features import FeatureSet


@pytest.fixture(autouse=True)
def tiny_chunks(monkeypatch):
    monkeypatch.setattr(_arrays, "CHUNK_ELEMENTS", 512)
    monkeypatch.setattr(_arrays, "MIN_CHUNK_ROWS", 7)
    monkeypatch.setattr(_backend, "PARALLEL_ROWS", 8)  # chunks of a few 8-row blocks, split across cores


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    c, d = 6, 12
    mu = rng.normal(size=(c, d)) * 2
    y = rng.integers(0, c, size=90)
    z = np.abs(mu[y] + rng.normal(size=(90, d))).astype(np.float32)
    w = rng.normal(size=(c, d)).astype(np.float32)
    b = rng.normal(size=c).astype(np.float32)
    f = (z.astype(np.float64) @ w.T + b).astype(np.float32)
    nac = (rng.normal(size=(90, 5)) * 0.5).astype(np.float32)
    train = FeatureSet(z, labels=y, logits=f, weight=w, bias=b, extras={"nac/pre_logits": nac})
    zt = np.abs(rng.normal(size=(25, d)) * 2).astype(np.float32)
    ft = (zt.astype(np.float64) @ w.T + b).astype(np.float32)
    nt = (rng.normal(size=(25, 5)) * 0.5).astype(np.float32)
    test = FeatureSet(zt, logits=ft, weight=w, bias=b, extras={"nac/pre_logits": nt})
    return train, test


def create(name, **hp):
    """The detector on its float64 path: these tests check formulas at float64 tolerances
    (the float32 path is checked against it in test_detectors_precision.py)."""
    det = detectors.create(name, **hp)
    return det.set_params(compute_dtype="float64") if "compute_dtype" in det.get_params() else det


def run(name, train, test, **hp):
    return create(name, **hp).fit(train).score(test)


def f64(a):
    return np.asarray(a, dtype=np.float64)


def test_logit_scores(data):
    train, test = data
    f = f64(test.logits)
    np.testing.assert_allclose(run("msp", train, test), softmax(f, axis=1).max(axis=1), rtol=1e-12)
    np.testing.assert_allclose(run("maxlogit", train, test), f.max(axis=1), rtol=1e-12)
    np.testing.assert_allclose(run("energy", train, test), logsumexp(f, axis=1), rtol=1e-12)
    np.testing.assert_allclose(run("energy", train, test, temperature=2.5), 2.5 * logsumexp(f / 2.5, axis=1), rtol=1e-12)
    for m in (3, 100):
        p = np.sort(softmax(f, axis=1), axis=1)[:, ::-1][:, :m]
        ref = -np.sum(p**0.1 * (1 - p) ** 0.1, axis=1)
        np.testing.assert_allclose(run("gen", train, test, top_m=m), ref, rtol=1e-9)


def test_kl_matching(data):
    train, test = data
    ptr = softmax(f64(train.logits), axis=1)
    pred = ptr.argmax(axis=1)
    templates = [ptr[pred == k].mean(axis=0) for k in range(ptr.shape[1]) if (pred == k).any()]
    p = softmax(f64(test.logits), axis=1)
    ref = np.array([-min(entropy(row, t) for t in templates) for row in p])
    np.testing.assert_allclose(run("kl_matching", train, test), ref, rtol=1e-9)


def energy_ref(z, w, b):
    return logsumexp(f64(z) @ f64(w).T + f64(b), axis=1)


def test_react(data):
    train, test = data
    c = np.percentile(f64(train.features).ravel(), 90)
    ref = energy_ref(np.minimum(test.features, c), test.weight, test.bias)
    det = create("react").fit(train)
    assert det.threshold_ == pytest.approx(c, rel=1e-12)
    np.testing.assert_allclose(det.score(test), ref, rtol=1e-10)


@pytest.mark.parametrize("q", [0.0, 13.7, 50.0, 90.0, 100.0])
@pytest.mark.parametrize("sample_rows", [0, 7, 1024])  # histogram only; a sampled bracket; every row
def test_chunked_percentile_is_exact(q, sample_rows):
    a = np.random.default_rng(1).normal(size=(301, 7)).astype(np.float32)
    a[5, :] = a[6, :]  # ties
    exact = np.percentile(f64(a), q)  # the same order statistics; the interpolation rounds within 1 ulp
    assert _common.chunked_percentile(a, q, bins=16, sample_rows=sample_rows) == pytest.approx(exact, rel=1e-12)


def test_chunked_percentile_falls_back_when_the_sample_misses():
    a = np.random.default_rng(2).normal(size=(1000, 5)).astype(np.float32)
    a[::100] -= 100.0  # the 10 sampled rows (every 100th) lie far below the rest
    assert _common._bracketed(a, 5, np.dtype(np.float32), 2500, 2501, sample_rows=10) is None
    assert _common.chunked_percentile(a, 50.0, sample_rows=10) == pytest.approx(np.percentile(f64(a), 50.0), rel=1e-12)
    a[3, 2] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        _common.chunked_percentile(a, 50.0, sample_rows=10)


def shaped_ref(z, percentile, prune):
    out = []
    for row in f64(z):
        n = row.size
        k = n - int(np.round(n * percentile / 100))
        keep = np.argsort(row)[::-1][:k]
        s1, s2 = row.sum(), row[keep].sum()
        kept = np.zeros_like(row)
        kept[keep] = row[keep]
        out.append((kept if prune else row) * np.exp(s1 / s2))
    return np.array(out)


def test_ash_s_and_scale(data):
    train, test = data
    for p in (90, 65):
        ref = energy_ref(shaped_ref(test.features, p, True), test.weight, test.bias)
        np.testing.assert_allclose(run("ash_s", train, test, percentile=p), ref, rtol=1e-10)
    for p in (85, 50):
        ref = energy_ref(shaped_ref(test.features, p, False), test.weight, test.bias)
        np.testing.assert_allclose(run("scale", train, test, percentile=p), ref, rtol=1e-10)


def test_ash_s_keeps_exactly_k_entries_under_ties():
    z = np.random.default_rng(3).normal(size=(6, 20)).astype(np.float32)  # k = 2 at percentile 90
    z[1, [3, 7, 11]] = 5.0  # three entries tie at a nonzero 2nd-largest value
    z[2] = 0.0
    z[2, 4] = 1.0  # the 2nd largest is 0, tied 19 times: extra zeros change nothing
    z[3, :5] = -1.0
    z[3, 5:] = -2.0  # negative features: the 2nd largest, -1, is tied 5 times
    shaped = activation.ash_s_features(z, 90.0)
    assert (np.count_nonzero(shaped, axis=1) == [2, 2, 1, 2, 2, 2]).all()
    # which of the tied entries are kept is arbitrary (as torch.topk's in the release): compare
    # each row's kept values; float32 output, so a few float32 ulps (6e-8 each)
    np.testing.assert_allclose(np.sort(shaped, axis=1), np.sort(shaped_ref(z, 90.0, True), axis=1), rtol=5e-7)


def test_dice(data):
    train, test = data
    w = f64(train.weight)
    contrib = f64(train.features).mean(axis=0) * w
    mask = contrib > np.percentile(contrib.ravel(), 70)
    ref = energy_ref(test.features, w * mask, test.bias)
    np.testing.assert_allclose(run("dice", train, test), ref, rtol=1e-10)


def maha_ref(train_z, y, test_z, relative):
    classes = np.unique(y)
    means = np.stack([train_z[y == c].mean(axis=0) for c in classes])
    centred = train_z - means[np.searchsorted(classes, y)]
    prec = EmpiricalCovariance(assume_centered=True).fit(centred).precision_
    d = cdist(test_z, means, "mahalanobis", VI=prec) ** 2
    score = -d.min(axis=1)
    if relative:
        bg = EmpiricalCovariance().fit(train_z)
        score = score + bg.mahalanobis(test_z)
    return score


@pytest.mark.parametrize("name", ["mahalanobis", "relative_mahalanobis", "mahalanobis_pp", "relative_mahalanobis_pp"])
def test_mahalanobis_family(data, name):
    train, test = data
    zt, zs = f64(train.features), f64(test.features)
    if name.endswith("_pp"):
        zt = zt / np.linalg.norm(zt, axis=1, keepdims=True)
        zs = zs / np.linalg.norm(zs, axis=1, keepdims=True)
    ref = maha_ref(zt, train.labels, zs, name.startswith("relative"))
    np.testing.assert_allclose(run(name, train, test), ref, rtol=1e-7, atol=1e-7)


def unit(z):
    z = f64(z)
    return z / np.linalg.norm(z, axis=1, keepdims=True)


def test_knn(data):
    train, test = data
    dist = np.sort(cdist(unit(test.features), unit(train.features)), axis=1)
    for k in (1, 5, 90):
        np.testing.assert_allclose(run("knn", train, test, k=k), -dist[:, k - 1], rtol=1e-5, atol=1e-6)


def test_cosine_and_mcm(data):
    train, test = data
    means = np.stack([f64(train.features)[train.labels == c].mean(axis=0) for c in np.unique(train.labels)])
    cos = 1 - cdist(f64(test.features), means, "cosine")
    np.testing.assert_allclose(run("cosine", train, test), cos.max(axis=1), rtol=1e-10)
    np.testing.assert_allclose(run("mcm", train, test), softmax(cos, axis=1).max(axis=1), rtol=1e-10)
    np.testing.assert_allclose(run("mcm", train, test, tau=0.1), softmax(cos / 0.1, axis=1).max(axis=1), rtol=1e-10)


def test_fdbd(data):
    train, test = data
    w, b = f64(train.weight), f64(train.bias)
    zbar = f64(train.features).mean(axis=0)
    ref = []
    for z in f64(test.features):
        f = w @ z + b
        y = f.argmax()
        terms = [abs(f[y] - f[c]) / np.linalg.norm(w[y] - w[c]) for c in range(len(f)) if c != y]
        ref.append(np.mean(terms) / np.linalg.norm(z - zbar))
    np.testing.assert_allclose(run("fdbd", train, test), ref, rtol=1e-9)


def test_neco(data):
    train, test = data
    ss = StandardScaler().fit(f64(train.features))
    pca = PCA().fit(ss.transform(f64(train.features)))
    d = int(np.argmax(np.cumsum(pca.explained_variance_ratio_) >= 0.9)) + 1
    xs = ss.transform(f64(test.features))
    ref = np.linalg.norm(pca.transform(xs)[:, :d], axis=1) / np.linalg.norm(xs, axis=1)
    det = create("neco").fit(train)
    assert det.n_components_ == d
    np.testing.assert_allclose(det.score(test), ref, rtol=1e-8)
    ref3 = np.linalg.norm(pca.transform(xs)[:, :3], axis=1) / np.linalg.norm(xs, axis=1)
    got = run("neco", train, test, dim=3, maxlogit=True)
    np.testing.assert_allclose(got, ref3 * f64(test.logits).max(axis=1), rtol=1e-8)


def test_vim(data):
    train, test = data
    w, b = f64(train.weight), f64(train.bias)
    u = -np.linalg.pinv(w) @ b
    cov = EmpiricalCovariance(assume_centered=True).fit(f64(train.features) - u).covariance_
    vals, vecs = np.linalg.eig(cov)  # the release's routine; fine on this well-separated spectrum
    ns = np.real(vecs[:, np.argsort(-np.real(vals))[6:]])
    vtrain = np.linalg.norm((f64(train.features) - u) @ ns, axis=1)
    alpha = (f64(train.features) @ w.T + b).max(axis=1).mean() / vtrain.mean()
    ref = energy_ref(test.features, w, b) - alpha * np.linalg.norm((f64(test.features) - u) @ ns, axis=1)
    assert detectors.hybrid.vim_dim(12) == 6
    np.testing.assert_allclose(run("vim", train, test), ref, rtol=1e-8)


@pytest.mark.parametrize("shape", [(10, 24), (24, 10)])
def test_vim_origin_is_the_pseudo_inverse_solution(shape, monkeypatch):
    # wide and tall heads through the Cholesky factor of the smaller Gram matrix and refinement,
    # up to cond(W) = 1e5 (cond(G) = 1e10); a rank-deficient head and one with cond(W) = 1e7 via gelsy
    rng = np.random.default_rng(5)
    u, _ = np.linalg.qr(rng.normal(size=(shape[0], min(shape))))
    v, _ = np.linalg.qr(rng.normal(size=(shape[1], min(shape))))
    b = rng.normal(size=shape[0])
    calls = []
    lstsq = hybrid.scipy.linalg.lstsq
    monkeypatch.setattr(hybrid.scipy.linalg, "lstsq", lambda *a, **k: calls.append(1) or lstsq(*a, **k))
    for smallest, via_gelsy in ((0.5, False), (1e-5, False), (0.0, True), (1e-7, True)):
        w = u @ np.diag(np.r_[np.linspace(1, 2, min(shape) - 1), smallest]) @ v.T
        ref = -np.linalg.pinv(w) @ b  # a backward-stable solution is within ~cond(W) eps of |u|
        cond = 1 / max(smallest, 1e-16)
        np.testing.assert_allclose(hybrid.logit_origin(w, b), ref, rtol=0, atol=100 * min(cond, 1e7) * 2.2e-16 * np.abs(ref).max())
        assert calls == [1] * via_gelsy
        calls.clear()


def test_nnguide(data):
    train, test = data
    det = create("nnguide", k=4, bank_fraction=0.5, seed=3).fit(train)
    bank = det.bank_index_
    assert bank.size == 45 and np.array_equal(bank, np.unique(bank))
    e_bank = logsumexp(f64(train.logits)[bank], axis=1)
    guide = unit(train.features)[bank] * e_bank[:, None]
    sims = np.sort(unit(test.features) @ guide.T, axis=1)[:, ::-1][:, :4]
    ref = logsumexp(f64(test.logits), axis=1) * sims.mean(axis=1)
    np.testing.assert_allclose(det.score(test), ref, rtol=1e-5, atol=1e-6)


def nac_grid_ref(m):
    half = m // 2
    x_l = np.emath.logn(1000, np.linspace(1, np.sqrt(1000), half))
    x = np.concatenate([x_l[:-1], (1 - x_l)[::-1]])
    x[-1] += 0.01
    return np.append(x, 1.2)


def test_nac(data):
    train, test = data
    o, m, a = 3, 12, 4.0
    grid = nac_grid_ref(m)
    s_tr = expit(a * f64(train.extras["nac/pre_logits"]))
    s_te = expit(a * f64(test.extras["nac/pre_logits"]))
    ref = np.zeros(len(s_te))
    for j in range(s_tr.shape[1]):
        counts = np.zeros(m - 1)
        for v in s_tr[:, j]:
            for i in range(m - 1):
                if grid[i] <= v < grid[i + 1]:
                    counts[i] += 1
        cov = np.minimum(counts / o, 1)
        for n, v in enumerate(s_te[:, j]):
            for i in range(m - 1):
                if grid[i] <= v < grid[i + 1]:
                    ref[n] += cov[i] / s_tr.shape[1]
    got = run("nac", train, test, n_fit=None, layer_params={"pre_logits": {"O": o, "M": m, "alpha": a}})
    np.testing.assert_allclose(got, ref, rtol=1e-12)
