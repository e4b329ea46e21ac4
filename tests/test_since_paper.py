"""The peers' methods since the paper (issue 42): each equals its release on the same arrays in float64.

Where the release is pytorch-ood 0.4.0 the test runs pytorch-ood's own class. pytorch-ood casts
its inputs with ``Tensor.float()`` and builds constants in torch's default dtype; to compare the
formulas in float64 (so that agreement is to float64 rounding, not to float32's), those casts are
made float64 for the duration of a test (:func:`torch64`). Each test also shows that the same
comparison fails on a deliberately wrong formula, so agreement is not a property of any score.
"""

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from oodeval import detectors
from oodeval.errors import InputError
from oodeval.metrics import all_metrics
from oodeval.testing import network_problem, small_problem

pood = pytest.importorskip("pytorch_ood.detector")


@pytest.fixture
def torch64(monkeypatch):
    """pytorch-ood in float64: ``Tensor.float()`` casts to float64 and new tensors default to it."""
    monkeypatch.setattr(torch.Tensor, "float", lambda self: self.double())
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


@pytest.fixture(scope="module")
def problem():
    return small_problem(seed=4)


def close(ours: np.ndarray, ref: np.ndarray, rtol: float) -> bool:
    return bool(np.allclose(ours, ref, rtol=rtol, atol=rtol * np.abs(ref).max()))


def same_results(ours: np.ndarray, ref: np.ndarray, n_id: int) -> None:
    """Spearman 1 and the same FPR@95 / AUROC (both higher = ID)."""
    assert spearmanr(ours, ref).statistic > 1 - 1e-12
    a, b = all_metrics(ours[:n_id], ours[n_id:]), all_metrics(ref[:n_id], ref[n_id:])
    assert a["fpr95"] == b["fpr95"] and a["auroc"] == b["auroc"]


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(a, dtype=np.float64))


# float64 throughout on both sides: the same sums of a few terms, so agreement to a few float64 ulps
# of the largest score (1e-12 leaves room for a different summation order and exp/log kernels)
RTOL64 = 1e-12


def test_webo_is_pytorch_oods_weighted_ebo(problem, torch64):
    """pytorch-ood 0.4.0 ``WeightedEBO.score``: -log sum_c relu(w_c) exp(f_c) (outlier score)."""
    train, test, ood = problem
    f = np.concatenate([test.logits, ood.logits])
    w = np.array([1.5, 0.2, -0.7, 0.0, 3.0])  # a negative and a zero weight: the ReLU matters
    ref = -pood.WeightedEBO.score(_t(f), _t(w)).numpy()
    det = detectors.create("WeightedEBO", class_weights=w.tolist(), compute_dtype="float64").fit(train)
    ours = np.concatenate([det.score(test), det.score(ood)])
    assert close(ours, ref, RTOL64)
    same_results(ours, ref, len(test))
    # torch backend, and float32 products (float64 sums): a few float32 ulps of |f + log w|
    on_torch = detectors.create("webo", class_weights=w.tolist(), device="cpu").fit(train)
    assert close(np.concatenate([on_torch.score(test), on_torch.score(ood)]), ref, 1e-6)
    # a deliberately wrong formula (|w| for relu(w)) fails the same comparison
    wrong = np.log((np.abs(w) * np.exp(f)).sum(axis=1))
    assert not close(wrong, ref, 1e-6)
    # uniform weights are the energy score exactly
    np.testing.assert_array_equal(detectors.create("webo").fit(train).score(test), detectors.create("energy").fit(train).score(test))


def test_webo_refuses_weights_that_do_not_fit(problem):
    train, test, _ = problem
    with pytest.raises(InputError, match=r"class_weights must be 5 finite numbers \(one per class\), got 3"):
        detectors.create("webo", class_weights=[1.0, 2.0, 3.0]).fit(train).score(test)
    with pytest.raises(InputError, match="every class weight is <= 0"):
        detectors.create("webo", class_weights=[0.0, -1.0, 0.0, 0.0, -2.0]).fit(train).score(test)
    with pytest.raises(InputError, match="class_weights"):
        detectors.create("webo", class_weights=3.0)


def test_pnml_is_pytorch_oods_pnml(problem, torch64):
    """pytorch-ood 0.4.0 ``PNML``: fit_features on the ID-train features and labels, predict_features
    with the head (W x + b on the normalised x); its regret is our score's negation."""
    train, test, ood = problem
    z = np.concatenate([test.features, ood.features])
    w, b = _t(train.weight), _t(train.bias)
    ref_det = pood.PNML(None, lambda x: x @ w.T + b).fit_features(_t(train.features), torch.from_numpy(train.labels))
    ref = -ref_det.predict_features(_t(z)).numpy()
    det = detectors.create("PNML", compute_dtype="float64").fit(train)
    ours = np.concatenate([det.score(test), det.score(ood)])
    assert close(ours, ref, 1e-10)  # P from eigh vs torch's pinv (SVD): float64 rounding times cond(X'X) ~ 1e2
    same_results(ours, ref, len(test))
    # the default float32 products (float64 sums), on numpy and torch: a few float32 ulps of |f|
    # (~10) in log p, so about 1e-5 of the regret
    for device in (None, "cpu"):
        fast = detectors.create("pnml", device=device).fit(train)
        assert close(np.concatenate([fast.score(test), fast.score(ood)]), ref, 1e-5)
    # a deliberately wrong formula: the head on the raw (unnormalised) features, as some versions of
    # the authors' repository read the model's own probabilities, fails the same comparison
    zn = z / np.linalg.norm(z, axis=1, keepdims=True)
    p = torch.softmax(_t(z) @ w.T + b, dim=1).clamp(1e-12, 1 - 1e-12).numpy()
    q = np.einsum("nd,de,ne->n", zn, det.projection_ @ det.projection_.T, zn)
    k = (q / (1 + q))[:, None]
    wrong = -np.log((p / (p + (1 - p) * p**k)).sum(axis=1)) / np.log(p.shape[1])
    assert not close(wrong, ref, 1e-6)


def test_multi_mahalanobis_is_mahalanobis_ensemble_without_noise(torch64):
    """pytorch-ood 0.4.0 ``MultiMahalanobis`` (fit_structured / predict_structured on the layers'
    spatial means) is ``mahalanobis_ensemble`` on an mds pass with noise 0: its outlier score is
    1/(2N) of our score's negation (it inverts the unnormalised scatter + 1e-6 I)."""
    train, test, ood = network_problem(seed=2)
    alpha = [0.3, 1.7]
    layers = [np.asarray(s.extras[f"mds/{n}"]) for s in (train, test, ood) for n in ("a", "b")]
    ref_det = pood.MultiMahalanobis([torch.nn.Identity()] * 2, alpha=alpha)
    ref_det.fit_structured([_t(layers[0]), _t(layers[1])], torch.from_numpy(train.labels))
    zs = [_t(np.concatenate([layers[2 + i], layers[4 + i]])) for i in range(2)]
    n = len(train)
    ref = -2 * n * ref_det.predict_structured(zs).numpy()
    det = detectors.create("MultiMahalanobis", weights=alpha).fit(train)
    ours = np.concatenate([det.score(test), det.score(ood)])
    # the per-layer distances are the mahalanobis detector's default float32 products (float64
    # sums): a few float32 ulps (2^-24) of ||u||^2 + ||nu_c||^2 per term of a 6-d form, within 32
    # ulps of the largest score; the release's ridge 1e-6 I on the scatter N S moves each distance
    # by at most 1e-6 / (N lambda_min(S)) of itself, S the tied (within-class) covariance
    s_min = min(np.linalg.eigvalsh(g.covariance_).min() for g in det.gaussians_.values())
    assert close(ours, ref, 32 * 2.0**-24 + 1e-6 / (n * s_min))
    same_results(ours, ref, len(test))
    # a deliberately wrong formula (the layers unweighted) fails the same comparison
    assert not close(det.layer_scores(test).sum(axis=1), ref[: len(test)], 1e-6)
    assert "since-paper" in detectors.REGISTRY.tags_of("mahalanobis_ensemble")


@pytest.mark.parametrize(("name", "peer"), [("webo", "pytorch-ood"), ("pnml", "pytorch-ood"), ("mahalanobis_ensemble", "pytorch-ood"),
                                            ("cfood", "openood"), ("optfs", None), ("kpca", None),
                                            ("cadref", "pytorch-ood"), ("ora", None), ("weiper", None), ("grood", "openood")])  # fmt: skip
def test_since_paper_methods_are_listed_with_their_release(name, peer):
    from oodeval.commands.detectors import listing

    entries = {e["name"]: e for e in listing(["since-paper"])}
    assert peer is None or peer in entries[name]["tags"]
    if peer == "pytorch-ood":  # its class name is an alias, its source in the listing
        assert any(src.startswith("pytorch-ood") for src in entries[name]["aliases"].values())
    assert not entries[name]["default_selection"]  # opt-in: the default selection stays the paper's 21


def _cfood_release(train_rows: np.ndarray, queries: np.ndarray, k: float, skip_self: int = 1) -> np.ndarray:
    """OpenOOD's CFOODPostprocessor (openood/postprocessors/cfood_postprocessor.py at
    a3eb335eb23bf944224f2f635983f31c3fac281d) re-derived in float64, row by row as it runs: the
    reference rows' sorted self-distances at the grid positions + 1, then per query the fraction of
    reference rows whose radius reaches it, and the first grid fraction where it is >= k (else 1);
    conf = -kappa. ``skip_self=0`` is the deliberately wrong formula (the row itself counted)."""
    unit = lambda z: z / (np.linalg.norm(z, axis=1, keepdims=True) + 1e-10)  # noqa: E731
    ref, q = unit(train_rows.astype(np.float64)), unit(queries.astype(np.float64))
    n = len(ref)
    kval = np.concatenate((np.linspace(0.001, 0.1, 100), np.linspace(0.105, 0.5, 81), np.linspace(0.51, 0.99, 49)))
    kpos = np.array(kval * n - 1, dtype=int)
    keep = np.concatenate(([True], kpos[:-1] < kpos[1:]))
    kval, kpos = kval[keep], kpos[keep]
    radii = np.stack([np.sort(((r - ref) ** 2).sum(axis=1))[kpos + skip_self] for r in ref])
    out = []
    for v in q:
        count = (radii >= ((v - ref) ** 2).sum(axis=1)[:, None]).sum(axis=0) / float(n)
        hit = np.flatnonzero(count >= k)
        out.append(-(kval[hit[0]] if hit.size else 1.0))
    return np.array(out)


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_cfood_is_openoods_cfood(problem, alpha):
    train, test, ood = problem
    det = detectors.create("cfood", alpha=alpha, k=0.05).fit(train)
    ours = np.concatenate([det.score(test), det.score(ood)])
    queries = np.concatenate([test.features, ood.features])
    ref = _cfood_release(np.asarray(train.features)[det.reference_index_], queries, 0.05)
    # grid values from the same comparisons in float64 (expanded vs direct distances differ by ~1e-16,
    # far from any comparison's margin here): equal
    np.testing.assert_array_equal(ours, ref)
    same_results(ours, ref, len(test))
    assert len(np.unique(ours)) > 5  # the grid really resolves the rows
    wrong = _cfood_release(np.asarray(train.features)[det.reference_index_], queries, 0.05, skip_self=0)
    assert not np.array_equal(wrong, ref)
    if alpha < 1:  # a seeded subset of int(alpha N) rows
        assert det.reference_index_.size == int(alpha * len(train))
        np.testing.assert_array_equal(det.reference_index_, detectors.create("cfood", alpha=alpha).fit(train).reference_index_)


def _optfs_release(train, rows, readout: str = "vanilla", weighted: bool = True) -> np.ndarray:
    """The OptFS release (Qinyu-Allen-Zhao/OptFSOOD, detector/ours.py at
    84f8f108a87479e7e2092b56d432823ce685a1fa, fixed weights) re-derived in float64: np.quantile
    bounds, np.arange left edges, per-interval masks, theta = I / ||I|| * 1000, the shaped feature
    summed with the predicted class's weights (or the energy of the shaped logits).
    ``weighted=False`` is the deliberately wrong formula (I without the class weights)."""
    z, w, b = (np.asarray(a, dtype=np.float64) for a in (train.features, train.weight, train.bias))
    pred = np.asarray(train.logits, dtype=np.float64).argmax(axis=1)
    left_b, right_b = np.quantile(z, 1e-3), np.quantile(z, 1 - 1e-3)
    width = (right_b - left_b) / 100.0
    edges = np.arange(left_b, right_b, width)
    lc = w[pred] * z if weighted else z
    contrib = np.array([np.mean(np.sum(((z >= e) & (z < e + width)) * lc, axis=1)) for e in edges])
    theta = contrib / np.linalg.norm(contrib, 2) * 1000
    q = np.asarray(rows.features, dtype=np.float64)
    shaped = np.zeros_like(q)
    for i, e in enumerate(edges):
        shaped += ((q >= e) & (q < e + width)) * q * theta[i]
    if readout == "energy":
        from scipy.special import logsumexp

        return logsumexp(shaped @ w.T + b, axis=1)
    return np.sum(w[np.asarray(rows.logits, dtype=np.float64).argmax(axis=1)] * shaped, axis=1)


@pytest.mark.parametrize("readout", ["vanilla", "energy"])
def test_optfs_is_the_authors_release(problem, readout):
    train, test, ood = problem
    det = detectors.create("optfs", readout=readout).fit(train)
    ours = np.concatenate([det.score(test), det.score(ood)])
    ref = np.concatenate([_optfs_release(train, test, readout), _optfs_release(train, ood, readout)])
    assert close(ours, ref, 1e-10)  # the same float64 sums in another order (bincount vs masked sums)
    same_results(ours, ref, len(test))
    wrong = np.concatenate([_optfs_release(train, s, readout, weighted=False) for s in (test, ood)])
    assert not close(wrong, ref, 1e-6)


def _kpca_release(train_z, rows, ratio, weights=None, phases=None, wrong_centre=False) -> np.ndarray:
    """The kernel PCA release (fanghenshaometeor/ood-kernel-pca, CoP_CoRP_ImgNet.py at
    5f24c69412d82e4fb0d14bdf6eae6f922f38d53b) re-derived in float64: normalise (+1e-10), the RFF
    map with the given draws (CoRP) or none (CoP), centre by the train mean, SVD of F'F, q by the
    cumulative explained-variance rule, score -||f - U_q U_q' f||. ``wrong_centre``: the
    deliberately wrong formula (no centring)."""
    unit = lambda x: x / (np.linalg.norm(x, ord=2, axis=-1, keepdims=True) + 1e-10)  # noqa: E731
    ftrain, ftest = unit(np.asarray(train_z, dtype=np.float64)), unit(np.asarray(rows, dtype=np.float64))
    if weights is not None:
        m = weights.shape[0]
        ftrain = np.sqrt(2 / m) * np.cos(ftrain.dot(weights.T) + phases[np.newaxis, :])
        ftest = np.sqrt(2 / m) * np.cos(ftest.dot(weights.T) + phases[np.newaxis, :])
    if not wrong_centre:
        mu = ftrain.mean(axis=0)
        ftrain, ftest = ftrain - mu, ftest - mu
    u_full, s, _ = np.linalg.svd(ftrain.T.dot(ftrain))
    q, acc = -1, np.zeros(ftrain.shape[1])
    for i in range(ftrain.shape[1]):
        acc[i] = sum(s[:i]) / sum(s)
        if i > 0 and q < 0 and acc[i - 1] < ratio <= acc[i]:
            q = i
    u_q = u_full[:, :q]
    return -np.linalg.norm(ftest - u_q.dot(u_q.T).dot(ftest.T).T, ord=2, axis=1)


@pytest.mark.parametrize("kernel", ["cosine", "cosine_gaussian"])
def test_kpca_is_the_authors_release(problem, kernel):
    train, test, ood = problem
    hp = {"explained_variance": 0.8} if kernel == "cosine" else {"n_features": 64, "gamma": 1.0}
    det = detectors.create("kpca", kernel=kernel, **hp).fit(train)
    ours = np.concatenate([det.score(test), det.score(ood)])
    rows = np.concatenate([test.features, ood.features])
    draws = (det.rff_weights_, det.rff_phases_) if kernel == "cosine_gaussian" else (None, None)
    ratio = hp.get("explained_variance", 0.5)
    ref = _kpca_release(train.features, rows, ratio, *draws)
    # float64 on both sides; eigh vs SVD and ||r||^2 - ||U'r||^2 vs the residual itself: a few ulps
    # of ||r||^2 relative to the residual's square (>= 1e-2 of it here)
    assert close(ours, ref, 1e-9)
    same_results(ours, ref, len(test))
    assert 1 < det.n_components_ < det.components_.shape[0]
    assert not close(_kpca_release(train.features, rows, ratio, *draws, wrong_centre=True), ref, 1e-6)


def _cadref_release(train, rows, method: str = "energy", paper_split: bool = False) -> np.ndarray:
    """The CADRef release (LingAndZero/CADRef, ood_methods/CADRef.py and utils/get_stat.py at
    e299a5878329fc1e7e8413e2c075ce6a8762da4d) re-derived in float64: ID-train rows grouped by the
    head's predicted class, their means, the mean logit score over all of them, then per row the
    l1 norms of the clipped parts of (z - mu_y) sign(w_y) over ||z||_1, each divided by its logit
    score. ``paper_split``: the deliberately wrong formula, Eqs. 7-8 as printed (split on
    sign(w_i z_i) of the raw feature)."""
    from scipy.special import logsumexp, softmax

    w, b = np.asarray(train.weight, dtype=np.float64), np.asarray(train.bias, dtype=np.float64)

    def logit_score(f):
        if method == "energy":
            return logsumexp(f, axis=1)
        if method == "maxlogit":
            return f.max(axis=1)
        p = softmax(f, axis=1)
        if method == "msp":
            return p.max(axis=1)
        m = max(10, f.shape[1] // 10)
        top = np.sort(p, axis=1)[:, -m:]
        return 1 / np.sum(top**0.1 * (1 - top) ** 0.1, axis=1)

    z_train = np.asarray(train.features, dtype=np.float64)
    f_train = z_train @ w.T + b
    pred = f_train.argmax(axis=1)
    means = np.stack([z_train[pred == k].mean(axis=0) for k in range(len(w))])
    global_score = logit_score(f_train).mean()
    z = np.asarray(rows.features, dtype=np.float64)
    f = z @ w.T + b
    y = f.argmax(axis=1)
    dist = z - means[y]
    sg = np.sign(w[y] * z) if paper_split else np.sign(w[y])
    ep = np.linalg.norm(np.where(dist * sg < 0, 0, dist * sg), ord=1, axis=1) / np.linalg.norm(z, ord=1, axis=1)
    en = np.linalg.norm(np.where(-dist * sg < 0, 0, -dist * sg), ord=1, axis=1) / np.linalg.norm(z, ord=1, axis=1)
    return -(ep / logit_score(f) + en / global_score)


@pytest.mark.parametrize("method", ["energy", "maxlogit", "msp", "gen"])
def test_cadref_is_the_authors_release(problem, method):
    train, test, ood = problem
    det = detectors.create("cadref", logit_score=method, compute_dtype="float64").fit(train)
    ours = np.concatenate([det.score(test), det.score(ood)])
    ref = np.concatenate([_cadref_release(train, s, method) for s in (test, ood)])
    assert det.unpredicted_classes_ == 0  # every class has its own centroid here, as the release needs
    assert close(ours, ref, RTOL64)  # the same float64 sums (in another order)
    same_results(ours, ref, len(test))
    # the default float32 head product: the logits off by a few float32 ulps of |W||z|, the rest float64
    fast = detectors.create("cadref", logit_score=method).fit(train)
    assert close(np.concatenate([fast.score(test), fast.score(ood)]), ref, 1e-5)
    wrong = np.concatenate([_cadref_release(train, s, method, paper_split=True) for s in (test, ood)])
    assert not close(wrong, ref, 1e-6)


def test_cadref_falls_back_to_the_global_mean_for_an_unpredicted_class(problem):
    """A class the head never predicts on ID train (the release: a NaN centroid) takes the mean
    of all ID-train rows, as pytorch-ood's CADRef does."""
    from oodeval.features import FeatureSet

    train, test, _ = problem
    bias = np.asarray(train.bias, dtype=np.float64).copy()
    bias[2] = -1e6  # class 2 is never the argmax
    fs = lambda s: FeatureSet(s.features, labels=s.labels, weight=s.weight, bias=bias.astype(s.bias.dtype))  # noqa: E731
    det = detectors.create("cadref", compute_dtype="float64").fit(fs(train))
    assert det.unpredicted_classes_ == 1
    np.testing.assert_allclose(det.class_means_[2], np.asarray(train.features, dtype=np.float64).mean(axis=0), rtol=1e-12)
    assert np.isfinite(det.score(fs(test))).all()


def _ora_release(train, rows, reduce=np.max) -> np.ndarray:
    """The ORA release (berkerdemirel/ORA-OOD-Detection-with-Relative-Angles, util/ood_methods.py
    ora_score at 4a4b3d63512428285b8e732cdb7167e12c0b2a57) re-derived in float64, class by class
    as it runs: the boundary point z - (max f - f_c) / ||w_y - w_c||^2 (w_y - w_c), both points
    centred on the mean of the class means (of ID train here) and normalised (eps 1e-12), the
    arccos of their cosine / pi, NaN (c = y) set to 0, the max over classes. ``reduce=np.mean``:
    the deliberately wrong formula (the release's commented-out mean)."""
    z_train = np.asarray(train.features, dtype=np.float64)
    labels = np.asarray(train.labels)
    mu = np.stack([z_train[labels == k].mean(axis=0) for k in np.unique(labels[labels >= 0])]).mean(axis=0)
    w, b = np.asarray(train.weight, dtype=np.float64), np.asarray(train.bias, dtype=np.float64)
    z = np.asarray(rows.features, dtype=np.float64)
    f = z @ w.T + b
    pred, top = f.argmax(axis=1), f.max(axis=1)
    unit = lambda a: a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)  # noqa: E731
    angles = np.zeros((len(z), len(w)))
    with np.errstate(divide="ignore", invalid="ignore"):
        for c in range(len(w)):
            diff = w[pred] - w[c]
            db = z - ((top - f[:, c]) / np.linalg.norm(diff, axis=1) ** 2)[:, None] * diff
            angles[:, c] = np.arccos(np.sum(unit(z - mu) * unit(db - mu), axis=1)) / np.pi
    angles[np.isnan(angles)] = 0
    return reduce(angles, axis=1)


def test_ora_is_the_authors_release(problem):
    train, test, ood = problem
    det = detectors.create("ora", compute_dtype="float64").fit(train)
    ours = np.concatenate([det.score(test), det.score(ood)])
    ref = np.concatenate([_ora_release(train, s) for s in (test, ood)])
    # the cosine formed in closed form vs from the explicit boundary points: a few float64 ulps of
    # it, which arccos (slope 1 / sin) magnifies at most 1 / sin(pi * min score) times
    assert close(ours, ref, 1e-12 / np.sin(np.pi * ref.min()))
    same_results(ours, ref, len(test))
    fast = detectors.create("ora").fit(train)  # float32 head product: a few float32 ulps of the cosine
    assert close(np.concatenate([fast.score(test), fast.score(ood)]), ref, 1e-5 / np.sin(np.pi * ref.min()))
    wrong = np.concatenate([_ora_release(train, s, reduce=np.mean) for s in (test, ood)])
    assert not close(wrong, ref, 1e-6)


def _weiper_release(train, rows, heads, hp, symmetric=True) -> np.ndarray:
    """The WeiPer release (mgranz/weiper, Weiper/OpenOOD/openood/postprocessors/weiper_kldiv/utils.py
    at f3cdf25c5c03ce61eb12508733841daace8ba40a) re-derived in float64 on the given perturbed heads:
    the train value range (exact_minmax), per row the histogram of its values by comparison with
    linspace(min, max + 1e-8) edges (-inf / inf bins dropped, over the row's value count), the mean
    train density, the row's density smoothed by torch's Conv1d(padding="same", "replicate") with
    uniform weights as UniformKernel, kldiv with eps 0.01 / 0.025, the mean max softmax of the
    perturbed heads, conf = -(KL + l1 KL_w - l2 MSP). ``symmetric=False``: the deliberately wrong
    formula (KL(p || q) alone, the release's other option)."""
    n_bins, r = hp["n_bins"], hp["n_repeats"]
    w, b = np.asarray(train.weight, dtype=np.float64), np.asarray(train.bias, dtype=np.float64)
    heads, bias = np.asarray(heads, dtype=np.float64), np.tile(b, r)

    def latents(s):
        z = np.asarray(s.features, dtype=np.float64)
        return z, z @ heads.T + bias

    def density(v, lo, hi):
        edges = np.concatenate([[-np.inf], np.linspace(lo, hi + 1e-8, n_bins + 1), [np.inf]])
        d = np.stack([((v >= edges[k]) & (v < edges[k + 1])).mean(axis=1) for k in range(n_bins + 2)])
        return d[1:-1] / d.sum(axis=0)  # (bins, rows)

    def smooth(d, size):
        conv = torch.nn.Conv1d(d.shape[1], d.shape[1], size, padding="same", padding_mode="replicate", bias=False).double()
        with torch.no_grad():
            conv.weight.zero_()
            conv.weight[range(d.shape[1]), range(d.shape[1])] = 1.0 / size
            return conv(_t(d.T)).T.numpy()

    def kldiv(p, q, eps):
        q_, p_ = q + eps, p + eps
        p_, q_ = p_ / p_.sum(axis=0), q_ / q_.sum(axis=0)
        one = -(p_ * (np.log(q_) - np.log(p_))).sum(axis=0)
        return one - (q_ * (np.log(p_) - np.log(q_))).sum(axis=0) if symmetric else one

    tz, tf = latents(train)
    (zlo, zhi), (flo, fhi) = (tz.min(), tz.max()), (tf.min(), tf.max())
    pz, pf = density(tz, zlo, zhi).mean(axis=1, keepdims=True), density(tf, flo, fhi).mean(axis=1, keepdims=True)
    z, f = latents(rows)
    kl = kldiv(pz, smooth(density(z, zlo, zhi), hp["smoothing"]), 0.01)
    kl_w = kldiv(pf, smooth(density(f, flo, fhi), hp["smoothing_perturbed"]), 0.025)
    c = len(w)
    msp = np.mean([torch.softmax(_t(f[:, k * c : (k + 1) * c]), dim=-1).max(dim=-1).values.numpy() for k in range(r)], axis=0)
    return -(kl + hp["lambda_1"] * kl_w - hp["lambda_2"] * msp)


@pytest.mark.parametrize("hp", [{}, {"n_repeats": 20, "n_bins": 30, "smoothing": 4, "smoothing_perturbed": 5, "lambda_2": 1.0}])
def test_weiper_is_the_authors_release(problem, hp):
    train, test, ood = problem
    det = detectors.create("weiper", **hp, compute_dtype="float64").fit(train)
    full = det.get_params()
    ours = np.concatenate([det.score(test), det.score(ood)])
    # the perturbed heads as the release builds them: W + delta ||w_c|| n / ||n||, one per repeat
    w = np.asarray(train.weight, dtype=np.float64)
    shift = det.perturbed_weight_.reshape(full["n_repeats"], *w.shape) - w
    np.testing.assert_allclose(np.linalg.norm(shift, axis=2), np.broadcast_to(full["perturbation_distance"] * np.linalg.norm(w, axis=1), shift.shape[:2]), rtol=1e-12)
    ref = np.concatenate([_weiper_release(train, s, det.perturbed_weight_, full) for s in (test, ood)])
    # the same float64 sums in another order; bins by one floor vs two comparisons (equal away from
    # an edge, which no value here is within 1e-12 of)
    assert close(ours, ref, 1e-10)
    same_results(ours, ref, len(test))
    wrong = np.concatenate([_weiper_release(train, s, det.perturbed_weight_, full, symmetric=False) for s in (test, ood)])
    assert not close(wrong, ref, 1e-6)
    # seeded: the same draws again, other draws for another seed
    np.testing.assert_array_equal(detectors.create("weiper", **hp, compute_dtype="float64").fit(train).perturbed_weight_, det.perturbed_weight_)
    assert not np.array_equal(detectors.create("weiper", **hp, seed=1, compute_dtype="float64").fit(train).perturbed_weight_, det.perturbed_weight_)


def test_weiper_refuses_a_fit_or_scoring_over_its_budget(problem):
    """2 r C D flop per row and pass of the perturbed heads: refused before any work past
    budget_tflop, the message naming the cost and what lowers it; within it, it runs."""
    train, test, _ = problem
    c, d = train.weight.shape
    fit_flop = 2.0 * 2 * len(train) * 10 * c * d
    with pytest.raises(InputError, match=rf"weiper: the fit \({len(train)} rows, 2 passes of 10 perturbed {c} x {d} heads\) would need up to {fit_flop / 1e12:.3g} TFLOP .* lower n_repeats"):
        detectors.create("weiper", n_repeats=10, budget_tflop=fit_flop / 1e12 * 0.99).fit(train)
    det = detectors.create("weiper", n_repeats=10, budget_tflop=fit_flop / 1e12 * 1.01).fit(train)
    score_flop = 2.0 * len(test) * 10 * c * d
    det.set_params(budget_tflop=score_flop / 1e12 * 0.99)
    with pytest.raises(InputError, match=rf"weiper: scoring \({len(test)} rows, 1 pass of 10 perturbed {c} x {d} heads\) would need .* raise budget_tflop"):
        det.score(test)
    assert np.isfinite(det.set_params(budget_tflop=score_flop / 1e12 * 1.01).score(test)).all()


def test_uniform_smoothing_is_torchs_replicate_same_convolution():
    from oodeval.detectors.hybrid import uniform_smooth

    d = np.random.default_rng(0).random((3, 17))
    for size in (1, 2, 4, 5, 15, 40):
        conv = torch.nn.Conv1d(3, 3, size, padding="same", padding_mode="replicate", bias=False).double()
        with torch.no_grad():
            conv.weight.zero_()
            conv.weight[range(3), range(3)] = 1.0 / size
            ref = conv(_t(d)).numpy()
        np.testing.assert_allclose(uniform_smooth(d, size), ref, rtol=1e-13, atol=1e-15)  # cumulative sums vs direct sums of <= 40 terms in [0, 1]


def _grood_release(train, rows, ood_rows=None, n_noise=100, softmax_factor=True) -> np.ndarray:
    """OpenOOD's GrOODPostprocessor (openood/postprocessors/grood.py and configs/postprocessors/
    grood.yaml at 3c35632ee91b54b09d1f085d04f94744cece7d0b) re-derived in float64 as it runs by
    default (use_direct_grad False): prototypes the label means, the OOD prototype the mean of the
    first ``n_noise`` OOD rows (use_val_ood; None: the mean of the prototypes, use_proto_mean),
    ncc = -||z - p_k|| over the C + 1, CE(ncc, argmax f) per row and its autograd gradient with
    respect to the OOD prototype, the ID-train rows whose label is argmax f indexed, and the score
    -(squared L2 distance to the nearest indexed gradient), by brute force (the release's IVF
    search approximates this 1-NN). ``softmax_factor=False``: the deliberately wrong formula (the
    unit vectors (z - p_K) / ||z - p_K|| without softmax(ncc)_K)."""
    z_train = np.asarray(train.features, dtype=np.float64)
    labels = np.asarray(train.labels)
    c = train.logits.shape[1]
    # a class without rows keeps the release's initial prototype, zeros (_init_prototypes)
    protos = torch.from_numpy(np.stack([z_train[labels == k].mean(axis=0) if (labels == k).any()
                                        else np.zeros(z_train.shape[1]) for k in range(c)]))  # fmt: skip
    noise = protos.mean(dim=0) if ood_rows is None else _t(ood_rows[:n_noise]).mean(dim=0)

    def gradients(z: np.ndarray, logits: np.ndarray) -> np.ndarray:
        target = torch.from_numpy(np.asarray(logits).argmax(axis=1))
        # one copy of p_K per row, so that the gradient of the summed losses holds each row's own
        p_k = noise.expand(len(z), -1).clone().requires_grad_(True)
        ncc = -torch.norm(_t(z)[:, None, :] - torch.cat([protos.expand(len(z), -1, -1), p_k[:, None]], dim=1), dim=2)
        torch.nn.functional.cross_entropy(ncc, target, reduction="none").sum().backward()
        grads = p_k.grad.numpy()
        # the closed form (the release's use_direct_grad): softmax(ncc)_K (z - p_K) / ||z - p_K||
        unit = (z - noise.numpy()) / np.linalg.norm(z - noise.numpy(), axis=1, keepdims=True)
        closed = torch.softmax(ncc.detach(), dim=1)[:, -1].numpy()[:, None] * unit
        np.testing.assert_allclose(grads, closed, rtol=1e-12, atol=1e-15)  # the same float64 terms in another order
        return grads if softmax_factor else unit

    keep = labels == np.asarray(train.logits).argmax(axis=1)
    bank = gradients(z_train[keep], np.asarray(train.logits)[keep])
    g = gradients(np.asarray(rows.features, dtype=np.float64), rows.logits)
    return -(((g[:, None, :] - bank[None, :, :]) ** 2).sum(axis=2)).min(axis=1)


@pytest.fixture(scope="module")
def misread():
    """small_problem with 30 ID-train rows relabelled, so that the release's filter (label = argmax f) drops rows."""
    from oodeval.features import FeatureSet

    train, test, ood = small_problem(seed=4)
    labels = np.asarray(train.labels).copy()
    labels[::7][:30] = (labels[::7][:30] + 1) % train.logits.shape[1]
    return FeatureSet(train.features, labels=labels, logits=train.logits, weight=train.weight, bias=train.bias), test, ood


def test_grood_is_openoods_grood(misread):
    train, test, ood = misread
    det = detectors.create("grood", compute_dtype="float64").fit(train)
    assert 0 < len(det.bank_) < len(train)  # the filter drops the relabelled rows
    ours = np.concatenate([det.score(test), det.score(ood)])
    ref = np.concatenate([_grood_release(train, s) for s in (test, ood)])
    # expanded squared distances (||g||^2 + ||h||^2 - 2 g h, as faiss forms them) vs direct ones: a
    # few float64 ulps of the largest squared gradient norm (<= 1), and the gradients' own rounding
    assert np.allclose(ours, ref, rtol=1e-12, atol=1e-13)
    same_results(ours, ref, len(test))
    # float32 products (float64 softmax): the expansion's float32 rounding, a few ulps (2^-24) of
    # ||g||^2 + ||h||^2 <= 2 per product of 16 terms, on numpy and on torch
    for device in (None, "cpu"):
        fast = detectors.create("grood", device=device).fit(train)
        assert np.allclose(np.concatenate([fast.score(test), fast.score(ood)]), ref, rtol=0, atol=64 * 2.0**-24)
    wrong = np.concatenate([_grood_release(train, s, softmax_factor=False) for s in (test, ood)])
    assert not np.allclose(wrong, ref, rtol=1e-6, atol=1e-6)
    assert spearmanr(wrong, ref).statistic < 0.999


def test_grood_takes_the_releases_ood_validation_prototype(misread, tmp_path):
    """The release's default prototype (use_val_ood): the mean of the first n_noise_samples rows of
    an OOD-validation FeatureSet folder, or that mean given as D numbers."""
    train, test, ood = misread
    folder = ood.save(tmp_path / "ood-val")
    det = detectors.create("grood", ood_prototype=str(folder), n_noise_samples=25, compute_dtype="float64").fit(train)
    ours = np.concatenate([det.score(test), det.score(ood)])
    ood_rows = np.asarray(ood.features, dtype=np.float64)
    ref = np.concatenate([_grood_release(train, s, ood_rows=ood_rows, n_noise=25) for s in (test, ood)])
    assert np.allclose(ours, ref, rtol=1e-12, atol=1e-13)
    same_results(ours, ref, len(test))
    given = detectors.create("grood", ood_prototype=ood_rows[:25].mean(axis=0).tolist(), compute_dtype="float64").fit(train)
    np.testing.assert_allclose(np.concatenate([given.score(test), given.score(ood)]), ours, rtol=1e-12, atol=1e-13)
    # and it is not the class-mean prototype's score
    assert not np.allclose(detectors.create("grood", compute_dtype="float64").fit(train).score(test), det.score(test), rtol=1e-6)


def test_grood_keeps_a_zero_prototype_for_a_class_without_rows(misread):
    from oodeval.features import FeatureSet

    train, test, _ = misread
    keep = np.asarray(train.labels) != 2
    part = FeatureSet(train.features[keep], labels=np.asarray(train.labels)[keep], logits=train.logits[keep],
                      weight=train.weight, bias=train.bias)  # fmt: skip
    det = detectors.create("grood", compute_dtype="float64").fit(part)
    assert det.empty_classes_ == 1 and not det.prototypes_[2].any()
    assert np.allclose(det.score(test), _grood_release(part, test), rtol=1e-12, atol=1e-13)


def test_grood_refuses_a_prototype_that_does_not_fit(misread, tmp_path):
    train, _, _ = misread
    with pytest.raises(InputError, match=r"ood_prototype must be 16 finite numbers \(one per feature\), got 3"):
        detectors.create("grood", ood_prototype=[1.0, 2.0, 3.0]).fit(train)
    with pytest.raises(InputError, match="neither 'class_mean' nor a FeatureSet folder"):
        detectors.create("grood", ood_prototype=str(tmp_path / "nowhere")).fit(train)
    with pytest.raises(InputError, match="ood_prototype"):
        detectors.create("grood", ood_prototype=3.0)
