"""Defaults profiles against the peers at the peers' own defaults (docs/detectors.md, defaults profiles).

pytorch-ood 0.4's classes run at their constructor defaults and OpenOOD v1.5's postprocessor
formulas, re-derived here at its config values, are compared with oodeval under that peer's
profile on the same arrays: Spearman rho 1 up to float32 near-ties (one adjacent swap among the
300 rows moves rho by 6*2/(300*(300^2-1)) ~ 4e-7, so rho > 1 - 1e-6 allows at most two). Where the
profile's values differ from the paper's, the paper profile is shown to rank differently, so the
test fails on a wrong profile value. pytorch-ood returns outlier scores: compared negated.
"""

import numpy as np
import pytest
import pytorch_ood.detector as pood
import torch
from scipy.special import logsumexp, softmax
from scipy.stats import spearmanr
from test_detectors_peers import linear, t

from oodeval.detectors import profiles
from oodeval.detectors._synthetic import synthetic_problem
from oodeval.errors import InputError
from oodeval.features import FeatureSet
from oodeval.scorer_factory import RunSets, build_scorer
from oodeval.evaluation import with_profiles

SAME = 1 - 1e-6


@pytest.fixture(scope="module")
def problem():
    """(ID train, ID test + OOD): 8 classes, 32-d, 1200 train rows (more than the paper's k = 1000)."""
    return _together(*synthetic_problem(n_classes=8, dim=32, n_train=1200, n_test=150, n_ood=150, seed=4))


def _together(train, test, ood):
    """(ID train, ID test + OOD in one FeatureSet): a ranking spans ID and OOD."""
    both = FeatureSet(np.concatenate([test.features, ood.features]), logits=np.concatenate([test.logits, ood.logits]),
                      weight=test.weight, bias=test.bias)
    return train, both


def ours(name, profile, train, x, **hp):
    scorer = build_scorer(name, {**hp, "defaults": profile}, RunSets(train, x))
    return scorer.fit(scorer.train).score(x)


def rho(a, b):
    return float(spearmanr(a, b).statistic)


def _maps(fs):
    return t(fs.features)[:, :, None, None]


def _head(train):
    lin = linear(train)
    return lambda m: lin(m.flatten(1))


def _soft(x):
    """Logits scaled so that every p > 1e-7: pytorch-ood's probability clip (GEN, Entropy) is idle."""
    return FeatureSet(x.features, logits=x.logits * 0.3, weight=x.weight, bias=x.bias)


# each: oodeval name -> (the pytorch-ood score at its defaults, whether its values differ from the paper's)
PYTORCH_OOD = {
    "msp": (lambda tr, x: pood.MaxSoftmax(None).predict_logits(t(x.logits, torch.float64)), False),
    "maxlogit": (lambda tr, x: pood.MaxLogit(None).predict_logits(t(x.logits, torch.float64)), False),
    "energy": (lambda tr, x: pood.EnergyBased(None).predict_logits(t(x.logits, torch.float64)), False),
    "kl_matching": (lambda tr, x: pood.KLMatching(None).fit_logits(t(tr.logits, torch.float64)).predict_logits(t(x.logits, torch.float64)), False),
    "gen": (lambda tr, x: pood.GEN(None).predict_logits(t(x.logits, torch.float64)), False),
    "entropy": (lambda tr, x: pood.Entropy(None).predict_logits(t(x.logits, torch.float64)), False),
    "react": (lambda tr, x: pood.ReAct(None, _head(tr)).fit_feature_maps(_maps(tr), t(tr.labels, torch.long)).predict_feature_maps(_maps(x)), False),
    "ash_s": (lambda tr, x: pood.ASH(None, _head(tr)).predict_feature_maps(_maps(x)), True),
    "ash_b": (lambda tr, x: pood.ASH(None, _head(tr), variant="ash-b").predict_feature_maps(_maps(x)), False),
    "ash_p": (lambda tr, x: pood.ASH(None, _head(tr), variant="ash-p").predict_feature_maps(_maps(x)), True),
    "scale": (lambda tr, x: pood.SCALE(None, _head(tr)).predict_feature_maps(_maps(x)), True),
    "vra": (lambda tr, x: pood.VRA(None, _head(tr)).fit_feature_maps(_maps(tr), t(tr.labels, torch.long)).predict_feature_maps(_maps(x)), True),
    "lts": (lambda tr, x: pood.LTS(None, linear(tr)).predict_features(t(x.features)), False),
    "mahalanobis": (lambda tr, x: pood.Mahalanobis(None).fit_features(t(tr.features), t(tr.labels, torch.long)).predict_features(t(x.features)), False),
    "relative_mahalanobis": (lambda tr, x: pood.RMD(None).fit_features(t(tr.features), t(tr.labels, torch.long)).predict_features(t(x.features)), False),
    "class_gmm": (lambda tr, x: pood.GMM(None).fit_features(t(tr.features, torch.float64), t(tr.labels, torch.long)).predict_features(t(x.features, torch.float64)), False),
    "knn": (lambda tr, x: pood.KNN(None).fit_features(t(tr.features), t(tr.labels, torch.long)).predict_features(t(x.features)), True),
    "she": (lambda tr, x: pood.SHE(None, linear(tr)).fit_features(t(tr.features), t(tr.labels, torch.long)).predict_features(t(x.features)), False),
    "fdbd": (lambda tr, x: pood.fDBD(None, linear(tr)).fit_features(t(tr.features)).predict_features(t(x.features)), False),
    "nci": (lambda tr, x: pood.NCI(None, linear(tr)).fit_features(t(tr.features)).predict_features(t(x.features)), False),
    "nnguide": (lambda tr, x: pood.NNGuide(None, linear(tr)).fit_features(t(tr.features), t(tr.labels, torch.long)).predict_features(t(x.features)), True),
    "temperature_scaling": (lambda tr, x: pood.TemperatureScaling(None).fit_logits(t(tr.logits), t(tr.labels, torch.long)).predict_logits(t(x.logits, torch.float64)), True),
    "openmax": (lambda tr, x: pood.OpenMax(None).fit_logits(t(tr.logits, torch.float64), t(tr.labels, torch.long)).predict_logits(t(x.logits, torch.float64)), True),
    "gradnorm": (lambda tr, x: pood.GradNorm(linear(tr, torch.float64), param_filter=lambda n: n == "weight").predict(t(x.features, torch.float64)), False),
}  # fmt: skip
#: pytorch-ood methods without a comparison here, and why
NOT_COMPARED = {
    "dice": "DICE's p has no default (a required argument)", "vim": "ViM's d has no default (a required argument)",
    "nac": "NACUE taps the network's layers", "grad_uncertainty": "no hyperparameters; compared in test_detectors_peers.py",
    "odin": "a network method", "mahalanobis_ensemble": "a network method", "gram": "a network method",
    "rankfeat": "a network method", "mc_dropout": "a network method",
}  # fmt: skip


def test_every_pytorch_ood_method_is_compared_or_says_why():
    named = {n for n, e in profiles.TABLE.items() if e.get("pytorch-ood") is not None}
    assert named == set(PYTORCH_OOD) | set(NOT_COMPARED)


@pytest.mark.parametrize("name", sorted(PYTORCH_OOD))
def test_pytorch_ood_profile_ranks_as_pytorch_ood_at_its_defaults(problem, name):
    train, x = problem
    if name in ("gen", "entropy"):
        x = _soft(x)
        assert softmax(x.logits.astype(np.float64), axis=1).min() > 1e-7
    peer, differs = PYTORCH_OOD[name]
    with torch.no_grad() if name != "gradnorm" else torch.enable_grad():
        theirs = -np.asarray(torch.as_tensor(peer(train, x)).detach().double())
    mine = ours(name, "pytorch-ood", train, x)
    if name == "openmax":  # its P(unknown) rounds to 1 on most rows (ties); ours is -log P(unknown)
        np.testing.assert_allclose(np.exp(-mine), -theirs, rtol=1e-4)  # the Weibull fits agree to ~1e-7 of the CDF
        assert np.exp(-ours(name, "paper", train, x)).round(4).tolist() != (-theirs).round(4).tolist()
        return
    assert rho(mine, theirs) > SAME
    if differs:  # the paper's values rank otherwise: a wrong profile value would fail above
        assert rho(ours(name, "paper", train, x), theirs) < SAME


# ---- OpenOOD v1.5, its postprocessors' formulas re-derived at its config values ----------------


def _energy(z, train):
    return logsumexp(z @ train.weight.astype(np.float64).T + train.bias, axis=1)


def _unit(z):
    z = z.astype(np.float64)
    return z / np.linalg.norm(z, axis=1, keepdims=True)


def openood_knn(train, x, k=50):
    """knn_postprocessor.py: -(distance to the K-th nearest normalised ID-train feature), K = 50."""
    d = np.sqrt(np.maximum(2 - 2 * _unit(x.features) @ _unit(train.features).T, 0))
    return -np.sort(d, axis=1)[:, k - 1]


def openood_ash_b(train, x, p=90):
    """ash_postprocessor.py (ash_b): keep the top n - round(n p / 100) entries, each set to sum / k; energy."""
    z = x.features.astype(np.float64)
    k = z.shape[1] - int(np.round(z.shape[1] * p / 100))
    top = np.argsort(-z, axis=1)[:, :k]
    shaped = np.zeros_like(z)
    np.put_along_axis(shaped, top, (z.sum(1) / k)[:, None], axis=1)
    return _energy(shaped, train)


def openood_react(train, x, p=90):
    """react_postprocessor.py: clip at the p-th percentile of every ID activation; energy."""
    return _energy(np.minimum(x.features.astype(np.float64), np.percentile(train.features.astype(np.float64).ravel(), p)), train)


def openood_dice(train, x, p=90):
    """dice_postprocessor.py: keep the weights whose contribution mean(z) * w exceeds its p-th percentile; energy."""
    contrib = train.features.astype(np.float64).mean(0)[None, :] * train.weight.astype(np.float64)
    mask = contrib > np.percentile(contrib, p)
    return logsumexp(x.features.astype(np.float64) @ (train.weight * mask).T + train.bias, axis=1)


def openood_gen(train, x, gamma=0.1, m=100):
    """gen_postprocessor.py: -sum over the top M softmax entries of p^g (1 - p)^g."""
    prob = np.sort(softmax(x.logits.astype(np.float64), axis=1), axis=1)[:, ::-1][:, :m]
    return -np.sum(prob**gamma * (1 - prob) ** gamma, axis=1)


def openood_nnguide(train, x, k=100, alpha=0.01):
    """nnguide_postprocessor.py: a bank of the first rows of the train loader (here the first
    max(K, ceil(alpha n)): its stop at a whole batch past int(alpha n) rows depends on the batch
    size), normalised and times their energy; score = mean top-K similarity * energy."""
    n = max(k, int(np.ceil(alpha * len(train))))
    bank = _unit(train.features[:n]) * logsumexp(train.logits[:n].astype(np.float64), axis=1)[:, None]
    conf = np.sort(_unit(x.features) @ bank.T, axis=1)[:, -k:].mean(1)
    return conf * logsumexp(x.logits.astype(np.float64), axis=1)


def openood_temperature(train, x):
    """temp_scaling_postprocessor.py: L-BFGS lr 0.01, max_iter 50 on the NLL from T = 1.5; MSP at T."""
    temp = torch.nn.Parameter(torch.ones(1) * 1.5)
    f, y = t(train.logits), torch.as_tensor(train.labels)
    opt = torch.optim.LBFGS([temp], lr=0.01, max_iter=50)

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(f / temp, y)
        loss.backward()
        return loss

    opt.step(step)
    return softmax(x.logits.astype(np.float64) / float(temp.detach()), axis=1).max(1)


# each: oodeval name -> (the re-derived OpenOOD score, whether its values differ from the paper's)
OPENOOD = {
    "knn": (openood_knn, True), "ash_b": (openood_ash_b, True), "react": (openood_react, False),
    "dice": (openood_dice, True), "gen": (openood_gen, False), "nnguide": (openood_nnguide, True),
    "temperature_scaling": (openood_temperature, True),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(OPENOOD))
def test_openood_profile_ranks_as_openoods_formula_at_its_config(problem, name):
    train, x = problem
    formula, differs = OPENOOD[name]
    theirs = formula(train, x)
    assert rho(ours(name, "openood", train, x), theirs) > SAME
    if differs:
        assert rho(ours(name, "paper", train, x), theirs) < SAME


def test_every_other_openood_method_has_the_papers_values_so_its_comparison_applies():
    """OpenOOD methods not re-derived here: the openood profile sets the class defaults (compared
    with OpenOOD's formulas at those values in test_detectors_peers.py and test_detectors_pytorch_ood.py),
    except the network methods, whose settings come from their extraction passes."""
    import inspect

    from oodeval import detectors

    compared = set(OPENOOD) | {"vim", "residual"}
    for name, entries in profiles.TABLE.items():
        found = entries.get("openood")
        if found is None or name in compared or "network" in detectors.REGISTRY.tags_of(name):
            continue
        params = inspect.signature(detectors.REGISTRY[name]).parameters
        assert {k: d.value for k, d in found.values.items()} == {k: params[k].default for k in found.values}, name


@pytest.fixture(scope="module")
def wide():
    """600-d features: wider than OpenOOD's vim dim 256 and residual dim 512."""
    return _together(*synthetic_problem(n_classes=8, dim=600, n_train=800, n_test=100, n_ood=100, seed=5))


def _residual_space(train, dim):
    """vim_postprocessor.py / residual_postprocessor.py: u = -pinv(W) b and the eigenvectors of the
    uncentred covariance of z - u beyond the top ``dim`` (eigh: the matrix is symmetric)."""
    w, b = train.weight.astype(np.float64), train.bias.astype(np.float64)
    u = -np.linalg.pinv(w) @ b
    zc = train.features.astype(np.float64) - u
    vals, vecs = np.linalg.eigh(zc.T @ zc / len(zc))
    return u, vecs[:, np.argsort(-vals)[dim:]]


def openood_vim(train, x, dim=256):
    """vim_postprocessor.py: energy - alpha ||(z - u) R||, alpha = mean max logit / mean ||.|| over ID train."""
    u, ns = _residual_space(train, dim)
    w, b = train.weight.astype(np.float64), train.bias.astype(np.float64)
    z = train.features.astype(np.float64)
    alpha = (z @ w.T + b).max(1).mean() / np.linalg.norm((z - u) @ ns, axis=1).mean()
    zx = x.features.astype(np.float64)
    return logsumexp(zx @ w.T + b, axis=1) - alpha * np.linalg.norm((zx - u) @ ns, axis=1)


def openood_residual(train, x, dim=512):
    """residual_postprocessor.py: -||(z - u) R|| (its ID val split is the ID-train set here)."""
    u, ns = _residual_space(train, dim)
    return -np.linalg.norm((x.features.astype(np.float64) - u) @ ns, axis=1)


@pytest.mark.parametrize("name, formula", [("vim", openood_vim), ("residual", openood_residual)])
def test_openood_vim_and_residual_dims(wide, name, formula):
    train, x = wide
    theirs = formula(train, x)
    assert rho(ours(name, "openood", train, x), theirs) > SAME
    assert rho(ours(name, "paper", train, x), theirs) < SAME  # the paper's D' = D / 2 = 300


# ---- resolution ---------------------------------------------------------------------------------


def test_a_peers_name_picks_its_profile_and_explicit_values_win(problem):
    train, x = problem
    names, hps = with_profiles(["ash", "KNN", "temp_scaling", "msp"], {"KNN": {"k": 7}})
    assert names == ["ash_b", "knn", "temperature_scaling", "msp"]
    assert hps == {"ash_b": {"defaults": "openood"}, "knn": {"k": 7, "defaults": "pytorch-ood"},
                   "temperature_scaling": {"defaults": "openood"}}  # fmt: skip
    scorer = build_scorer("knn", hps["knn"], RunSets(train, x))
    assert scorer.resolved()["k"] == 7 and scorer.resolved()["defaults"] == "pytorch-ood"
    # the run's profile for the others; a detector's own profile wins over a peer's name
    names, hps = with_profiles(["knn", "ash"], {"ash": {"defaults": "paper"}}, "pytorch-ood")
    assert hps == {"knn": {"defaults": "pytorch-ood"}, "ash_b": {"defaults": "paper"}}
    assert with_profiles(names, hps, "openood") == (names, hps)  # resolving again keeps each one's
    assert build_scorer("ash_b", {}, RunSets(train, x)).resolved()["percentile"] == 65.0
    assert build_scorer("ash_b", {"defaults": "openood"}, RunSets(train, x)).resolved()["percentile"] == 90.0
    # a peer that lacks the method: the paper's values
    assert build_scorer("cosine", {"defaults": "openood"}, RunSets(train, x)).resolved()["defaults"] == "openood"
    with pytest.raises(InputError, match="not a defaults profile"):
        with_profiles(["knn"], {}, "openod")


def test_sweep_grids_are_openoods():
    assert profiles.sweep_grid("knn", "openood") == {"k": [50, 100, 200, 500, 1000]}
    assert profiles.sweep_grid("ash_b", "openood") == {"percentile": [65, 70, 75, 80, 85, 90, 95]}
    with pytest.raises(InputError, match="no openood sweep grid"):
        profiles.sweep_grid("mahalanobis", "openood")


# ---- experiments, commands, report --------------------------------------------------------------


def test_experiment_defaults_top_level_per_detector_alias_and_openoods_grid(tmp_path):
    from test_report_html import make_sets

    from oodeval.experiment import load_config

    paths = make_sets(tmp_path)
    cfg = {
        "defaults": "openood",
        "results": str(tmp_path / "r.parquet"),
        "selection": {"validation_id": "val_id", "validation_ood": "val_ood"},
        "datasets": {"id_train": "t", "id_test": "v", "ood": ["big"]},
        "models": [{"name": "m", "features": {"id_train": paths["id_train"], "id_test": paths["id_test"], "big": paths["big"],
                                              "validation_id": paths["id_test"], "validation_ood": paths["small"]}}],
        "detectors": ["knn", "KNN", {"name": "knn", "defaults": "paper", "label": "knn-paper"}, {"name": "ash", "search": "openood"}],
    }
    specs = load_config(cfg).detectors
    assert [(s.name, s.hyperparameters, s.search) for s in specs] == [
        ("knn", {"defaults": "openood"}, {}), ("knn", {"defaults": "pytorch-ood"}, {}), ("knn", {"defaults": "paper"}, {}),
        ("ash_b", {"defaults": "openood"}, {"percentile": [65, 70, 75, 80, 85, 90, 95]}),
    ]  # fmt: skip
    (spec,) = load_config({**cfg, "detectors": ["knn"]}, defaults="pytorch-ood").detectors  # run --defaults wins over the file's
    assert spec.hyperparameters == {"defaults": "pytorch-ood"}
    with pytest.raises(InputError, match="not a defaults profile"):
        load_config({**cfg, "defaults": "oodeval"})
    with pytest.raises(InputError, match="no openood sweep grid"):
        load_config({**cfg, "detectors": [{"name": "mahalanobis", "search": "openood"}]})


def test_score_under_each_profile_and_the_report_side_by_side(tmp_path, capsys):
    import json

    import pandas as pd
    from test_report_html import make_sets

    from oodeval import cli
    from oodeval.report import write_report

    paths = make_sets(tmp_path)
    base = ["score", "--train", paths["id_train"], "--test", paths["id_test"], "--ood", f"big={paths['big']}",
            "--detectors", "knn,vra", "--draws", "10", "--no-progress"]  # fmt: skip
    tables = {}
    for profile in ("openood", "pytorch-ood"):
        out = tmp_path / f"{profile}.csv"
        assert cli.main([*base, "--defaults", profile, "--out", str(out)]) == 0
        tables[profile] = pd.read_csv(out, comment="#")
    for profile, table in tables.items():
        resolved = table.set_index("detector")["hyperparameters_resolved"].map(json.loads)
        assert resolved["knn"]["defaults"] == profile and resolved["knn"]["k"] == 50
        assert resolved["vra"]["per_dim"] == (profile == "pytorch-ood")
    results = tmp_path / "all.parquet"
    for profile in ("paper", "openood", "pytorch-ood"):
        assert cli.main([*base[:-5], "--detectors", "vra", "--draws", "10", "--no-progress", "--defaults", profile, "--out", str(results)]) == 0
    md = write_report(results, tmp_path / "rep", draws=10, formats=("png",))["markdown"].read_text()
    for shown in ("| vra defaults |", "| vra openood defaults |", "| vra pytorch-ood defaults |"):
        assert shown in md, shown


def test_validation_search_over_openoods_aps_grid(tmp_path):
    from oodeval import detectors
    from oodeval.experiment import run_experiment
    from oodeval.metrics import auroc, fpr_at_tpr
    from oodeval.results import load_results

    train, test_all, ood_all = synthetic_problem(n_classes=4, dim=32, n_train=200, n_test=160, n_ood=160, seed=1)

    def part(fs, sl):
        return FeatureSet(fs.features[sl], labels=None if fs.labels is None else fs.labels[sl], logits=fs.logits[sl],
                          weight=fs.weight, bias=fs.bias)  # fmt: skip

    test, val_id, ood, val_ood = part(test_all, slice(80)), part(test_all, slice(80, None)), part(ood_all, slice(80)), part(ood_all, slice(80, None))
    sets = {"id_train": train, "id_test": test, "big": ood, "validation_id": val_id, "validation_ood": val_ood}
    paths = {k: str(fs.save(tmp_path / k)) for k, fs in sets.items()}
    cfg = {
        "bootstrap_draws": 5, "results": str(tmp_path / "r.parquet"),
        "selection": {"validation_id": "val_id", "validation_ood": "val_ood"},
        "datasets": {"id_train": "t", "id_test": "v", "ood": ["big"]},
        "models": [{"name": "m", "features": paths}],
        "detectors": [{"name": "ash", "search": "openood"}],
    }  # fmt: skip
    summary = run_experiment(cfg, progress=False)
    assert summary.failed == 0
    (row,) = load_results(summary.results).to_dict("records")
    assert row["detector"] == "ash_b"
    # the choice recomputed on the validation sets: lowest FPR@95, ties to the higher AUROC, then grid order
    grid = [65, 70, 75, 80, 85, 90, 95]
    keys = []
    for p in grid:
        det = detectors.create("ash_b", percentile=p).fit(train)
        s_id, s_ood = det.score(val_id), det.score(val_ood)
        keys.append((fpr_at_tpr(s_id, s_ood), -auroc(s_id, s_ood)))
    chosen = grid[keys.index(min(keys))]
    assert row["selection"].startswith(f"validation: percentile={chosen} chosen from percentile in {grid}"), row["selection"]
