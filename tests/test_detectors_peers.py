"""The peers' methods against the peers: pytorch-ood 0.4's implementations run on the same arrays,
OpenOOD v1.5's formulas re-derived here from its postprocessors (its package does not install).

pytorch-ood returns outlier scores (higher = OOD), so they are compared negated. Where the formula
is the same, values are compared with a tolerance from the arithmetic (pytorch-ood's float32:
rtol 1e-5; float64 on both sides: 1e-9); a score that is a monotone transform of the peer's (a
log, a constant factor or offset) is compared through that transform, and ranks by Spearman.
"""

import json
import logging

import numpy as np
import pytest
import pytorch_ood.detector as pood
import torch
from scipy.special import logsumexp, softmax
from scipy.stats import exponweib, spearmanr
from sklearn.covariance import EmpiricalCovariance
from sklearn.decomposition import PCA
from sklearn.mixture import GaussianMixture

from oodeval import detectors
from oodeval.detectors._synthetic import synthetic_problem
from oodeval.errors import InputError
from oodeval.features import FeatureSet


@pytest.fixture(scope="module")
def problem(scored_together):
    return scored_together


def t(a, dtype=torch.float32):
    """A copy as a tensor: some peers shape their input in place (ASH), which must not reach ours."""
    return torch.tensor(np.array(a)).to(dtype)


def linear(train, dtype=torch.float32):
    lin = torch.nn.Linear(train.weight.shape[1], train.weight.shape[0]).to(dtype)
    with torch.no_grad():
        lin.weight.copy_(t(train.weight, dtype))
        lin.bias.copy_(t(train.bias, dtype))
    return lin


def rho(a, b) -> float:
    return float(spearmanr(a, b).statistic)


def same(ours, theirs_outlier, rtol=1e-5, atol=1e-6):
    """ours (higher = ID) equals minus the peer's outlier score."""
    theirs = -np.asarray(torch.as_tensor(theirs_outlier).detach().double())
    np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=atol)
    assert rho(ours, theirs) > 0.9999


def score(name, train, x, **hp):
    return detectors.create(name, **hp).fit(train).score(x)


# ---- logits ------------------------------------------------------------------------------------


def test_entropy_is_pytorch_oods_where_its_clip_is_inactive(problem):
    train, x = problem
    soft = FeatureSet(x.features, logits=x.logits * 0.3)  # every p > 1e-7: pytorch-ood's clip is idle
    assert softmax(soft.logits.astype(np.float64), axis=1).min() > 1e-7
    theirs = pood.Entropy(None).predict_logits(t(soft.logits, torch.float64))
    same(score("entropy", train, soft, compute_dtype="float64"), theirs, rtol=1e-9, atol=1e-12)
    same(score("entropy", train, soft), theirs, rtol=1e-6, atol=1e-7)  # float32 exps: a few ulps


def _noisy_logits(seed=0, n=600, c=6):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, c, n)
    f = 2.5 * np.eye(c)[y] + 1.5 * rng.standard_normal((n, c))  # about 30% wrong: an interior optimum
    return FeatureSet(np.zeros((n, 1), np.float32), labels=y, logits=f.astype(np.float32))


def test_temperature_scaling_reaches_the_nll_minimum_pytorch_ood_approaches():
    fit = _noisy_logits()
    det = detectors.create("temperature_scaling", val_fraction=0.5).fit(fit)
    rows = det.val_rows_
    assert rows.size == 300 and np.all(np.diff(rows) > 0)  # a seeded half of the labelled rows
    f, y = fit.logits[rows].astype(np.float64), fit.labels[rows]

    def nll(temp):
        return float(np.mean(logsumexp(f / temp, axis=1) - f[np.arange(len(f)), y] / temp))

    ts = det.temperature_
    h = 1e-4 * ts
    assert nll(ts) <= min(nll(ts - h), nll(ts + h))  # the minimum, to the search's tolerance
    peer = pood.TemperatureScaling(None).fit_logits(t(f), torch.as_tensor(y))
    theirs = float(peer.t.detach())
    assert nll(ts) < nll(theirs)  # pytorch-ood's 50 L-BFGS steps (lr 0.01) stop short of the minimum
    x = _noisy_logits(seed=1)
    ours = det.score(x)
    np.testing.assert_allclose(ours, softmax(x.logits.astype(np.float64) / ts, axis=1).max(1), rtol=1e-6)
    assert det.resolved_params()["temperature"] == ts
    with torch.no_grad():
        peer.t.fill_(ts)  # at the same T the scores are the same
    same(ours, peer.predict_logits(t(x.logits, torch.float64)), rtol=1e-6)


def _openood_openmax(train, x, tail=20, alpha=3):
    """OpenOOD's openmax_postprocessor, re-derived: MAVs and Weibull tails of correctly classified
    rows, Euclidean distance, libmr's shift; returns P(unknown), the last of the K + 1 OpenMax
    probabilities (its score is conf = -P(unknown))."""
    f, y = train.logits.astype(np.float64), train.labels
    c = f.shape[1]
    models = []
    for k in range(c):
        rows = f[(y == k) & (f.argmax(1) == k)]
        mav = rows.mean(0)
        tailv = np.sort(np.linalg.norm(rows - mav, axis=1))[-tail:]
        _, shape, _, scale = exponweib.fit(tailv + 10000 - tailv.min(), floc=0, f0=1)
        models.append((mav, shape, scale, 10000 - tailv.min()))
    out = []
    for v in x.logits.astype(np.float64):
        ranked = v.argsort()[::-1][:alpha]
        omega = np.zeros(c)
        omega[ranked] = [(alpha + 1 - i) / alpha for i in range(1, alpha + 1)]
        mod, unk = [], []
        for k, (mav, shape, scale, shift) in enumerate(models):
            w = exponweib.cdf(np.linalg.norm(v - mav) + shift, 1, shape, 0, scale)
            mod.append(v[k] * (1 - w * omega[k]))
            unk.append(v[k] - mod[-1])
        e = np.exp(mod)
        total = e.sum() + np.exp(np.sum(unk))
        out.append(np.exp(np.sum(unk)) / total)
    return np.array(out)


def test_openmax_matches_pytorch_ood_and_openood(problem):
    train, x = problem
    ours = score("openmax", train, x, tailsize=20, alpha=3, correct_only=False)
    peer = pood.OpenMax(None, tailsize=20, alpha=3, euclid_weight=1.0)
    peer.fit_logits(t(train.logits, torch.float64), torch.as_tensor(train.labels))
    p_unknown = np.asarray(peer.predict_logits(t(x.logits, torch.float64)))
    # ours is -log P(unknown); the Weibull fits agree to about 1e-7 of the CDF
    np.testing.assert_allclose(np.exp(-ours), p_unknown, rtol=1e-4, atol=1e-12)
    assert rho(ours, -p_unknown) > 0.9999
    openood = _openood_openmax(train, x)
    mine = score("openmax", train, x)  # OpenOOD's defaults: correct rows, tail 20, alpha 3, its readout -P(unknown)
    np.testing.assert_allclose(np.exp(-mine), openood, rtol=1e-4)


def test_weibull_mle_is_scipys_maximum_likelihood_fit():
    """Our vectorised fit (bisection on the likelihood equation, every class at once) against
    scipy's weibull_min.fit(floc=0) (a general optimiser) on libmr-shifted tails: the same
    maximum, parameters within scipy's optimiser tolerance (its shape moves by ~1e-8 relative
    along the flat top of the likelihood), and a log-likelihood no lower than scipy's beyond
    float64 rounding of a sum of 20 terms."""
    from scipy.stats import weibull_min

    from oodeval.detectors.logit import weibull_mle

    rng = np.random.default_rng(0)
    tails = np.sort(rng.gamma(3, 2, (6, 20)), axis=1)
    tails = tails - tails.min(1, keepdims=True) + 10000
    mask = np.ones(tails.shape, bool)
    mask[5, :7] = False  # a class with a short tail
    shape, scale = weibull_mle(tails, mask)
    for i in range(6):
        x = tails[i][mask[i]]
        c, _, s = weibull_min.fit(x, floc=0)
        np.testing.assert_allclose(shape[i], c, rtol=1e-6)
        np.testing.assert_allclose(scale[i], s, rtol=1e-9)
        ours, theirs = weibull_min.logpdf(x, shape[i], 0, scale[i]).sum(), weibull_min.logpdf(x, c, 0, s).sum()
        assert ours >= theirs - 1e-12 * abs(theirs)
    flat = weibull_mle(np.full((1, 5), 10000.0))
    assert np.isinf(flat[0][0]) and flat[1][0] == 10000.0


def test_openmax_top_classes_break_ties_as_a_stable_sort():
    from oodeval.detectors.logit import _top_classes

    f = np.array([[1.0, 3.0, 3.0, 0.0, 3.0], [5.0, 1.0, 2.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    for alpha in (1, 2, 3, 5):
        np.testing.assert_array_equal(_top_classes(f, alpha), np.argsort(-f, axis=1, kind="stable")[:, :alpha])


# ---- features ----------------------------------------------------------------------------------


def test_she_nci_class_gmm_are_pytorch_oods(problem):
    train, x = problem
    z, y, zx = t(train.features), torch.as_tensor(train.labels), t(x.features)
    she = pood.SHE(None, linear(train)).fit_features(z, y)
    same(score("she", train, x), she.predict_features(zx))
    for alpha in (0.0, 1e-4, 0.05):
        nci = pood.NCI(None, linear(train), alpha=alpha).fit_features(z)
        same(score("nci", train, x, alpha=alpha), nci.predict_features(zx), rtol=1e-4, atol=1e-5)
    gmm = pood.GMM(None, reg=1e-6).fit_features(t(train.features, torch.float64), y)
    same(score("class_gmm", train, x), gmm.predict_features(t(x.features, torch.float64)), rtol=1e-9, atol=1e-9)


def test_she_falls_back_to_labelled_mean_for_a_class_never_right(problem):
    train, x = problem
    f = train.logits.copy()
    f[:, 0] = -50.0  # class 0 is never predicted: no correctly classified row
    broken = FeatureSet(train.features, labels=train.labels, logits=f, weight=train.weight, bias=train.bias)
    rows = train.features[train.labels == 0].astype(np.float64)
    exact = detectors.create("she", compute_dtype="float64").fit(broken)
    np.testing.assert_allclose(exact.patterns_[0], rows.mean(0), rtol=1e-12)
    # float32: the class sums of a chunk in float32, at most (n + 2) eps32 of the sum of |z|
    det = detectors.create("she").fit(broken)
    bound = (len(rows) + 2) * np.finfo(np.float32).eps * np.abs(rows).mean(0)
    assert (np.abs(det.patterns_[0] - rows.mean(0)) <= bound).all()
    assert np.isfinite(det.score(x)).all()


def test_residual_is_openoods(problem):
    train, x = problem
    w, b = train.weight.astype(np.float64), train.bias.astype(np.float64)
    u = -np.linalg.pinv(w) @ b
    ec = EmpiricalCovariance(assume_centered=True).fit(train.features.astype(np.float64) - u)
    vals, vecs = np.linalg.eig(ec.covariance_)
    ns = np.real(vecs.T[np.argsort(-np.real(vals))[16:]]).T
    theirs = -np.linalg.norm((x.features.astype(np.float64) - u) @ ns, axis=1)
    np.testing.assert_allclose(score("residual", train, x, dim=16, compute_dtype="float64"), theirs, rtol=1e-7)
    # float32: z - m (m the ID-train mean) rounded and the sgemm's sums, each within D eps32 of
    # ||z - m||, read through the orthonormal R
    zm = np.linalg.norm(x.features.astype(np.float64) - train.features.astype(np.float64).mean(0), axis=1)
    err = np.abs(score("residual", train, x, dim=16) - theirs)
    assert (err <= x.features.shape[1] * np.finfo(np.float32).eps * zm).all()


def test_relation_is_openoods(problem):
    train, x = problem

    def embed(fs):
        z = fs.features.astype(np.float64)
        return z / np.sqrt((z**2).sum(-1) + 1e-10)[:, None], softmax(fs.logits.astype(np.float64), axis=1)

    (zt, pt), (zx, px) = embed(train), embed(x)
    for pow_ in (1, 4):
        rel = np.clip(zx @ zt.T, 0, None) * (px @ pt.T)
        masked = rel * (np.abs(rel) > 0.03)
        theirs = (np.sign(masked) * np.abs(masked) ** pow_).sum(-1)
        np.testing.assert_allclose(score("relation", train, x, pow=pow_, compute_dtype="float64"), theirs, rtol=1e-10)
        # float32 products of unit vectors and of probabilities: each r_j within D eps32 of its
        # value relative to itself (pow times that for r_j^pow), a sum of positive terms likewise
        # (no pair lies that close to the threshold here)
        rtol = pow_ * zt.shape[1] * np.finfo(np.float32).eps
        np.testing.assert_allclose(score("relation", train, x, pow=pow_), theirs, rtol=rtol)


def test_gmm_is_openoods_sklearn_tied_mixture(problem):
    train, x = problem
    gm = GaussianMixture(n_components=8, random_state=0, covariance_type="tied").fit(train.features.astype(np.float64))
    zc = x.features.astype(np.float64)[:, None, :] - gm.means_[None]
    maha = np.einsum("nkd,de,nke->nk", zc, gm.precisions_, zc)
    theirs = np.log(np.exp(-0.5 * maha) @ gm.weights_ + 1e-40)  # OpenOOD's score
    ours = score("gmm", train, x, n_components=8, dim=None)
    live = theirs > np.log(1e-30)  # where OpenOOD's exp has not underflowed to its 1e-40 floor
    assert live.sum() > 100
    offset = ours[live] - theirs[live]  # the Gaussian's normalising constant, one value for tied
    np.testing.assert_allclose(offset, offset[0], atol=1e-8)
    assert rho(ours, theirs) > 0.999


@pytest.mark.parametrize(("k", "dim"), [(8, None), (5, 6), (50, 50)])
def test_gmm_blocked_em_is_sklearns_pca_and_tied_mixture(problem, k, dim):
    """OpenOOD's pipeline (sklearn PCA, then GaussianMixture(tied, random_state=0)) against ours
    (eigh of the covariance, then EM on the BLAS): the same k-means start, the same number of EM
    steps, and log-likelihoods equal to 1e-9 of their scale. The two differ only in float64
    rounding: the squared distances as |y|^2 - 2 y.c + |c|^2 (error a few eps times |y|^2 + |c|^2,
    ~1e-13 here) instead of |y - c|^2, and the principal axes from eigh instead of an SVD (equal up
    to sign, which no distance sees); EM's fixed point is stable, so these do not grow."""
    train, x = problem
    z = train.features.astype(np.float64)
    axes = np.eye(z.shape[1]) if dim is None or dim >= z.shape[1] else PCA(n_components=dim).fit(z).components_.T
    gm = GaussianMixture(n_components=k, random_state=0, covariance_type="tied").fit(z @ axes)
    det = detectors.create("gmm", n_components=k, dim=dim).fit(train)
    assert det.n_iter_ == gm.n_iter_
    ref = gm.score_samples(x.features.astype(np.float64) @ axes)
    np.testing.assert_allclose(det.score(x), ref, rtol=0, atol=1e-9 * np.abs(ref).max())


def test_gmm_defaults_are_openoods_final_layer():
    params = detectors.create("gmm").get_params()
    assert params["n_components"] == 50 and params["dim"] == 50  # gmm.yml: num_clusters 50, pca_50


def test_gmm_and_class_gmm_refuse_beyond_their_budgets_up_front(problem):
    train, x = problem
    with pytest.raises(InputError, match=r"gmm: the fit .* would need up to .* TFLOP .* over budget_tflop=1e-06; reduce n_components or dim"):
        detectors.create("gmm", budget_tflop=1e-6).fit(train)
    with pytest.raises(InputError, match=r"class_gmm: 8 float64 32 x 32 Cholesky factors need .* GiB, over memory_gb=1e-05; reduce the feature dimension"):
        detectors.create("class_gmm", memory_gb=1e-5).fit(train)
    det = detectors.create("class_gmm", budget_tflop=2e-6).fit(train)  # the fit: 2 N D^2 + K D^3 = 1.9e6 flop
    with pytest.raises(InputError, match=r"class_gmm: scoring 300 rows against 8 covariances of D=32 would need up to 2.46e-06 TFLOP .* raise budget_tflop"):
        det.score(x)
    # relation: 2 N B (D + C) flop for N scored rows against B bank rows
    n, bank, width = len(x), len(train), train.features.shape[1] + train.logits.shape[1]
    det = detectors.create("relation", budget_tflop=1e-6).fit(train)
    with pytest.raises(InputError, match=rf"relation: scoring {n} rows against a bank of {bank} would need up to {2 * n * bank * width / 1e12:.3g} TFLOP .* lower bank_fraction, or raise budget_tflop"):
        det.score(x)


# ---- shaping and gradients ---------------------------------------------------------------------


def test_ash_b_ash_p_vra_lts_are_pytorch_oods(problem):
    train, x = problem
    lin = linear(train)
    head = lambda m: lin(m.flatten(1))  # noqa: E731
    maps = t(x.features)[:, :, None, None]
    for variant, name, p in (("ash-b", "ash_b", 65), ("ash-p", "ash_p", 90)):
        ash = pood.ASH(None, head, variant=variant, percentile=p / 100)
        same(score(name, train, x, percentile=p), ash.predict_feature_maps(maps), rtol=1e-5, atol=1e-5)
    vra = pood.VRA(None, head, lower_percentile=0.01, upper_percentile=0.99)
    vra.fit_feature_maps(t(train.features)[:, :, None, None], torch.as_tensor(train.labels))
    same(score("vra", train, x, low=1, high=99, per_dim=True), vra.predict_feature_maps(maps), rtol=1e-5, atol=1e-5)
    lts = pood.LTS(None, lin, p=0.05)
    same(score("lts", train, x), lts.predict_features(t(x.features)), rtol=1e-5, atol=1e-5)


def test_vra_default_is_openoods_global_clip(problem):
    train, x = problem
    flat = train.features.astype(np.float64).ravel()
    lo, hi = np.percentile(flat, 10), np.percentile(flat, 90)
    z = np.clip(x.features.astype(np.float64), lo, hi)
    theirs = logsumexp(z @ train.weight.astype(np.float64).T + train.bias, axis=1)
    np.testing.assert_allclose(score("vra", train, x), theirs, rtol=1e-5)


def test_gradnorm_and_grad_uncertainty_are_the_peers_last_layer_gradients(problem):
    train, x = problem
    zx = t(x.features, torch.float64)
    ours = score("gradnorm", train, x)
    peer = pood.GradNorm(linear(train, torch.float64), param_filter=lambda n: n == "weight")
    same(ours, peer.predict(zx), rtol=1e-5, atol=1e-9)  # the cached logits are float32 W z + b
    # OpenOOD sums its loss over classes (targets all ones): C times the same gradient
    lin = linear(train, torch.float64)
    openood = []
    for row in zx:
        lin.zero_grad()
        torch.sum(-torch.log_softmax(lin(row[None]), dim=-1)).backward()
        openood.append(float(lin.weight.grad.abs().sum()))
    np.testing.assert_allclose(np.array(openood) / 8, ours, rtol=1e-5)
    # torch's BCE backward divides by max(p (1 - p), 1e-12), so where a class has p (1 - p) below
    # 1e-12 (a confident row) pytorch-ood's is not the gradient: compared on the other rows
    unc = -np.asarray(pood.GradUncertainty(linear(train, torch.float64)).predict(zx))
    p = softmax(x.logits.astype(np.float64), axis=1)
    whole = (p * (1 - p)).min(1) > 1e-12
    assert 100 < whole.sum() < len(p)
    ours = score("grad_uncertainty", train, x)
    np.testing.assert_allclose(ours[whole], unc[whole], rtol=1e-5)
    assert not np.allclose(ours[~whole], unc[~whole], rtol=1e-5)


# ---- names -------------------------------------------------------------------------------------


def test_peer_names_resolve_to_ours_and_say_so(problem, caplog, monkeypatch):
    train, x = problem
    monkeypatch.setattr(detectors.REGISTRY, "_said", set())  # said once per process: earlier tests may have
    caplog.set_level(logging.INFO, logger="oodeval.registry")
    assert type(detectors.create("ebo")).name == "energy"
    assert "'ebo' is OpenOOD v1.5's name for oodeval's 'energy'" in caplog.text
    expected = {"mls": "maxlogit", "mds": "mahalanobis", "rmds": "relative_mahalanobis", "klm": "kl_matching",
                "temp_scaling": "temperature_scaling", "ash": "ash_b", "EnergyBased": "energy", "MaxSoftmax": "msp",
                "RMD": "relative_mahalanobis", "ViM": "vim", "KNN": "knn", "GMM": "class_gmm"}  # fmt: skip
    for peer, ours in expected.items():
        assert detectors.canonical(peer) == ours
    from oodeval.evaluation import evaluate_detectors

    rows = evaluate_detectors(train, x, {"x": x}, ["ebo", "MaxLogit"], {"ebo": {"temperature": 2.0}}, progress=False)
    assert [r["detector"] for r in rows] == ["energy", "maxlogit"]  # the rows record oodeval's names
    assert json.loads(rows[0]["hyperparameters_resolved"])["temperature"] == 2.0
    with pytest.raises(ValueError, match="unknown detectors \\['eboo'\\]"):
        evaluate_detectors(train, x, {"x": x}, ["eboo"], progress=False)


def test_openood_tag_lists_every_post_hoc_method_it_has_for_a_classifier():
    from oodeval.detectors.peer_names import OPENOOD

    listed = detectors.names("openood")
    # OpenOOD's v1.5 methods under its names, and those it added since (cfood; tagged since-paper too)
    assert set(listed) == set(OPENOOD.values()) | set(detectors.names("openood", "since-paper"))
    for key in ["msp", "ebo", "mls", "klm", "temp_scaling", "openmax", "gradnorm", "react", "ash", "scale", "dice", "vra",
                "mds", "rmds", "gmm", "knn", "she", "residual", "fdbd", "nac", "vim", "nnguide", "relation", "nci", "gen"]:  # fmt: skip
        assert detectors.canonical(key) in listed, key
    assert "class_gmm" not in listed and "class_gmm" in detectors.names("pytorch-ood")


def test_the_peers_methods_are_opt_in(problem):
    train, x = problem
    picked = detectors.supported(train, x)
    assert "openmax" not in picked and "residual" not in picked and "msp" in picked


def test_the_detectors_command_lists_tags_hyperparameters_and_peer_names(capsys):
    from oodeval.cli import main

    assert main(["detectors", "--tag", "openood", "--json"]) == 0
    entries = json.loads(capsys.readouterr().out)
    assert [e["name"] for e in entries] == detectors.names("openood")
    om = next(e for e in entries if e["name"] == "openmax")
    assert om["hyperparameters"] == {"tailsize": 20, "alpha": 3, "distance": "euclidean", "eu_weight": 0.005,
                                     "correct_only": True, "readout": "unknown", "compute_dtype": "float32", "device": None}  # fmt: skip
    assert om["aliases"] == {"OpenMax": "pytorch-ood"} and om["default_selection"] is False
    energy = next(e for e in entries if e["name"] == "energy")
    assert energy["aliases"] == {"ebo": "OpenOOD v1.5", "EnergyBased": "pytorch-ood"} and energy["default_selection"]
    assert energy["label"] == "Energy" and om["label"] == "openmax"  # the paper's label; a peer method keeps its name
    assert main(["detectors"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == f"{len(detectors.names())} detectors" and "also: ebo (OpenOOD v1.5; runs under its defaults profile)" in out
    assert main(["detectors", "--tag", "nope"]) == 2
    assert "oodeval detectors: error: unknown detector tag(s) nope" in capsys.readouterr().err


PEER_NAMES = ["entropy", "temp_scaling", "OpenMax", "residual", "SHE", "relation", "NCI", "gmm", "GMM",
              "ash", "ash_p", "VRA", "LTS", "GradNorm", "GradUncertainty"]  # fmt: skip


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("peers")
    train, test, ood = synthetic_problem(n_classes=5, dim=16, n_train=300, n_test=80, n_ood=60, seed=3, nac=False)
    for name, fs in {"train": train, "test": test, "far": ood}.items():
        fs.save(root / name)
    return root


def test_every_peer_method_runs_in_score_and_the_grid_under_its_peer_name(folders, tmp_path, capsys):
    import pandas as pd

    from oodeval.cli import main
    from oodeval.metrics import auroc
    from oodeval.results import load_results

    base = ["score", "--train", str(folders / "train"), "--test", str(folders / "test"),
            "--ood", f"far={folders / 'far'}", "--detectors", ",".join(PEER_NAMES), "--set", "ash.percentile=80",
            "--no-progress"]  # fmt: skip
    assert main([*base, "--out", str(tmp_path / "t.csv")]) == 0
    table = pd.read_csv(tmp_path / "t.csv", comment="#")
    canonical = [detectors.canonical(n) for n in PEER_NAMES]
    assert list(table.detector) == canonical and (table.status == "ok").all()
    assert json.loads(table.set_index("detector").loc["ash_b", "hyperparameters"])["percentile"] == 80
    train, test, far = (FeatureSet.load(folders / n) for n in ("train", "test", "far"))
    # a peer's name runs under its peer's defaults profile: OpenMax at pytorch-ood's tail 25, alpha 10, all labelled rows
    det = detectors.create("openmax", tailsize=25, alpha=10, correct_only=False).fit(train)
    assert table.set_index("detector").loc["openmax", "auroc"] == pytest.approx(auroc(det.score(test), det.score(far)))
    assert json.loads(table.set_index("detector").loc["openmax", "hyperparameters"]) == {"defaults": "pytorch-ood"}
    assert main([*base, "--out", str(tmp_path / "t.parquet"), "--draws", "1"]) == 0  # the experiment grid
    grid = load_results(tmp_path / "t.parquet")
    assert set(grid.detector) == set(canonical) and (grid.status == "ok").all()
    capsys.readouterr()
