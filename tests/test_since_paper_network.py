"""The since-paper methods of OpenOOD that need one or more networks (issue 42): the deep ensemble
(``ensemble``), AdaSCALE-A / -L (``adascale_a``, ``adascale_l``) and i-ODIN (``iodin``).

Each test re-derives the release's maths from its code (file and commit in each helper's
docstring) on a tiny random torch model and small inputs, in float64 where the method allows,
compares oodeval's scores with it, and shows that the same comparison fails on a deliberately
wrong formula.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import spearmanr

from oodeval import detectors
from oodeval.errors import InputError
from oodeval.features import FeatureSet
from oodeval.features.ensemble import ensemble_featureset
from oodeval.metrics import all_metrics

OPENOOD = "3c35632ee91b54b09d1f085d04f94744cece7d0b"


def same_results(ours: np.ndarray, ref: np.ndarray, n_id: int) -> None:
    """Spearman 1 and the same FPR@95 / AUROC (both higher = ID)."""
    assert spearmanr(ours, ref).statistic > 1 - 1e-12
    a, b = all_metrics(ours[:n_id], ours[n_id:]), all_metrics(ref[:n_id], ref[n_id:])
    assert a["fpr95"] == b["fpr95"] and a["auroc"] == b["auroc"]


# ---------------------------------------------------------------------------------- deep ensemble
def _nets(m: int = 3, d: int = 6, c: int = 4) -> list[torch.nn.Module]:
    """M tiny float64 classifiers of one architecture, each from its own seed (the ensemble's members)."""
    out = []
    for seed in range(m):
        torch.manual_seed(seed)
        out.append(torch.nn.Sequential(torch.nn.Linear(d, 8), torch.nn.ReLU(), torch.nn.Linear(8, c)).double().eval())
    return out


def _openood_ensemble(nets: list[torch.nn.Module], data: torch.Tensor, mean_probs: bool = False) -> np.ndarray:
    """OpenOOD's EnsemblePostprocessor.postprocess (openood/postprocessors/ensemble_postprocessor.py at
    3c35632ee91b54b09d1f085d04f94744cece7d0b) re-derived: the members' logits summed into a zero
    tensor and divided by their number, softmax, the maximum is the confidence. ``mean_probs``: the
    mean of the members' maximum softmax, the deliberately wrong formula."""
    with torch.no_grad():
        logits = [net(data) for net in nets]
        if mean_probs:
            return (sum(torch.softmax(f, dim=1).max(dim=1).values for f in logits) / len(logits)).numpy()
        mean = torch.zeros_like(logits[0])
        for f in logits:
            mean += f
        mean /= len(logits)
        return torch.softmax(mean, dim=1).max(dim=1).values.numpy()


def _member_sets(nets, x_id: torch.Tensor, x_ood: torch.Tensor, labels: np.ndarray) -> list[tuple[FeatureSet, FeatureSet]]:
    out = []
    for k, net in enumerate(nets):
        with torch.no_grad():
            pair = tuple(FeatureSet(features=net[:2](x).numpy(), logits=net(x).numpy(), labels=y,
                                    meta={"model": "tiny", "weights_hash": f"seed{k}", "dataset": name})
                         for x, y, name in ((x_id, labels, "id"), (x_ood, np.full(len(x_ood), -1), "ood")))  # fmt: skip
        out.append(pair)
    return out


def test_deep_ensemble_is_openoods_ensemble():
    nets = _nets()
    gen = torch.Generator().manual_seed(0)
    x_id, x_ood = torch.randn(40, 6, generator=gen, dtype=torch.float64), 2.5 * torch.randn(30, 6, generator=gen, dtype=torch.float64)
    members = _member_sets(nets, x_id, x_ood, np.arange(40) % 4)
    test = ensemble_featureset([m[0] for m in members], ["s0", "s1", "s2"])
    ood = ensemble_featureset([m[1] for m in members], ["s0", "s1", "s2"])
    det = detectors.create("ensemble").fit()  # OpenOOD's key is an alias
    ours = np.concatenate([det.score(test), det.score(ood)])
    ref = np.concatenate([_openood_ensemble(nets, x_id), _openood_ensemble(nets, x_ood)])
    # float64 on both sides: the same mean of three logits and one softmax, a few float64 ulps of 1
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-14)
    same_results(ours, ref, 40)
    wrong = np.concatenate([_openood_ensemble(nets, x_id, mean_probs=True), _openood_ensemble(nets, x_ood, mean_probs=True)])
    assert not np.allclose(wrong, ref, rtol=0, atol=1e-6)
    # the members are recorded; msp on the ensemble's (mean) logits is the same score
    assert [m["name"] for m in det.resolved_params()["members"]] == ["s0", "s1", "s2"]
    assert [m["weights_hash"] for m in det.resolved_params()["members"]] == ["seed0", "seed1", "seed2"]
    np.testing.assert_allclose(detectors.create("msp", compute_dtype="float64").fit().score(test), ours[:40], rtol=0, atol=1e-14)
    # the paper's mean predictive distribution
    with torch.no_grad():
        probs = sum(torch.softmax(net(x_id), dim=1) for net in nets).numpy() / 3
    np.testing.assert_allclose(detectors.create("deep_ensemble", mode="probs").fit().score(test), probs.max(axis=1), rtol=0, atol=1e-14)


def test_deep_ensemble_refuses_sets_that_are_not_one_ensemble():
    nets = _nets()
    x = torch.randn(10, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    members = _member_sets(nets, x, x, np.arange(10) % 4)
    with pytest.raises(InputError, match="at least two members"):
        ensemble_featureset([members[0][0]])
    shuffled = FeatureSet(members[1][0].features, logits=members[1][0].logits, labels=np.roll(members[1][0].labels, 1), meta=members[1][0].meta)
    with pytest.raises(InputError, match="other labels"):
        ensemble_featureset([members[0][0], shuffled])
    with pytest.raises(InputError, match="not a deep ensemble's FeatureSet"):
        detectors.create("deep_ensemble").fit().score(FeatureSet(members[0][0].features, logits=members[0][0].logits, extras={"ensemble/0": members[0][0].logits}))
    det = detectors.create("deep_ensemble").fit()
    det.score(ensemble_featureset([members[0][0], members[1][0]], ["a", "b"]))
    with pytest.raises(InputError, match="holds the members"):
        det.score(ensemble_featureset([members[0][0], members[2][0]], ["a", "b"]))


def _grid_sets(root, seed: int) -> dict[str, str]:
    """One member model's precomputed FeatureSets (its own random head on shared ID / OOD features)."""
    rng = np.random.default_rng(100)  # the data: the same for every member
    y_train, y_test = np.arange(60) % 3, np.arange(30) % 3
    mu = rng.normal(size=(3, 5)) * 2
    z = {"id_train": mu[y_train] + rng.normal(size=(60, 5)), "id_test": mu[y_test] + rng.normal(size=(30, 5)), "far": 3 * rng.normal(size=(25, 5))}
    labels = {"id_train": y_train, "id_test": y_test, "far": np.full(25, -1)}
    w = np.random.default_rng(seed).normal(size=(3, 5)) + mu
    paths = {}
    for role, feats in z.items():
        fs = FeatureSet(features=feats.astype(np.float32), logits=(feats @ w.T).astype(np.float32), labels=labels[role],
                        meta={"model": "tiny", "weights_hash": f"seed{seed}", "dataset": role})  # fmt: skip
        paths[role] = str(fs.save(root / f"m{seed}" / role))
    return paths


def test_an_experiment_scores_an_ensemble_of_its_models(tmp_path):
    from oodeval.experiment import load_config, run_experiment
    from oodeval.results import load_results

    cfg = {
        "results": str(tmp_path / "out" / "results.parquet"), "bootstrap_draws": 20,
        "datasets": {"id_train": "train", "id_test": "test", "ood": ["far"]},
        "models": [{"name": "tiny", "label": "tiny s0", "features": _grid_sets(tmp_path, 0)},
                   {"name": "tiny", "label": "tiny s1", "features": _grid_sets(tmp_path, 1)},
                   {"ensemble": ["tiny s0", "tiny s1"], "label": "tiny x2"}],
        "detectors": ["msp"],
    }  # fmt: skip
    summary = run_experiment(load_config(cfg, base_dir=tmp_path), progress=False)
    assert summary.ok, summary.errors
    rows = load_results(summary.results).set_index("model")
    assert rows.loc["tiny x2", "detector"] == "deep_ensemble" and rows.loc["tiny s0", "detector"] == "msp"
    members = json.loads(rows.loc["tiny x2", "hyperparameters_resolved"])["members"]
    assert [m["name"] for m in members] == ["tiny s0", "tiny s1"] and [m["weights_hash"] for m in members] == ["seed0", "seed1"]
    # the row's AUROC is deep_ensemble's on the members' FeatureSets made one here
    sets = {r: ensemble_featureset([FeatureSet.load(tmp_path / f"m{k}" / r) for k in (0, 1)], ["tiny s0", "tiny s1"]) for r in ("id_test", "far")}
    det = detectors.create("deep_ensemble").fit()
    want = all_metrics(det.score(sets["id_test"]), det.score(sets["far"]))["auroc"]
    assert rows.loc["tiny x2", "auroc"] == pytest.approx(want, abs=1e-12)
    # a rerun computes nothing
    again = run_experiment(load_config(cfg, base_dir=tmp_path), progress=False)
    assert again.computed == 0 and again.skipped == again.total == 3
    # without an id_train set (the members' precomputed ones fit them): an ensemble fits on nothing
    assert load_config({**cfg, "datasets": {"id_test": "test", "ood": ["far"]}}, base_dir=tmp_path).models[2].ensemble == ("tiny s0", "tiny s1")
    with pytest.raises(InputError, match="ensemble member\\(s\\) tiny s9 are not model labels"):
        load_config({**cfg, "models": [*cfg["models"][:2], {"ensemble": ["tiny s0", "tiny s9"]}]}, base_dir=tmp_path)
    with pytest.raises(InputError, match="takes only detectors, ensemble, label, name"):
        load_config({**cfg, "models": [*cfg["models"][:2], {"ensemble": ["tiny s0", "tiny s1"], "weights": "w.pt"}]}, base_dir=tmp_path)


def test_an_ensemble_of_one_model_takes_each_seeds_weights(tmp_path):
    """A member with a weights file per seed contributes each (named by seed), read through the run's FeatureFn."""
    from oodeval.experiment import load_config
    from oodeval.experiment.runner import ensemble_features

    cfg = load_config({"seeds": [0, 1, 2], "datasets": {"id_train": "train", "id_test": "test", "ood": ["far"]},
                       "models": [{"name": "tiny", "label": "r", "weights": ["a.pt", "b.pt", "c.pt"]}, {"ensemble": ["r"]}]},
                      base_dir=tmp_path)  # fmt: skip
    seen = []

    def fake(model, weights, ds, role, cfg):
        seen.append(weights.rsplit("/", 1)[-1])
        rng = np.random.default_rng(len(seen))
        return FeatureSet(features=rng.normal(size=(4, 3)), logits=rng.normal(size=(4, 2)), meta={"dataset": role})

    fs = ensemble_features(fake)(cfg.models[1], None, cfg.id_test, "id_test", cfg)
    assert seen == ["a.pt", "b.pt", "c.pt"]
    assert [m["name"] for m in fs.meta["ensemble"]["members"]] == ["r seed 0", "r seed 1", "r seed 2"]
    assert cfg.models[1].label == "ensemble(r)" and [d.name for d in cfg.models[1].detectors] == ["deep_ensemble"]


# ---------------------------------------------------------------------------------- AdaSCALE and i-ODIN
@pytest.fixture(scope="module")
def net_sets(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """test_resnet (96-d features; tests/test_network_methods.py's lively random weights) on tiny ID
    train / test and OOD folders, each extracted once with the adascale pass (defaults) and the iodin
    pass (eps 0.5, so that one perturbed value moves the logits well beyond float32 rounding)."""
    from test_network_methods import KW, _folder, _lively_weights

    from oodeval.features.extract import extract
    from oodeval.features.pass_options import parse_pass

    root = tmp_path_factory.mktemp("since")
    _folder(root / "train", ("a", "b", "c"), 6, 0)
    _folder(root / "test", ("a", "b", "c"), 3, 1)
    _folder(root / "ood", ("x",), 9, 2, smooth=True)
    opts = dict(model_kwargs=KW, weights=_lively_weights(root / "w.safetensors"), progress=False, batch_size=64)
    specs = [parse_pass("adascale", True), parse_pass("iodin", "eps=0.5")]
    out = {"root": root, "opts": opts, "specs": specs, "paths": {}}
    for name in ("train", "test", "ood"):
        out["paths"][name] = extract("test_resnet", root / name, root / "store", passes=specs, **opts)
        out[name] = FeatureSet.load(out["paths"][name])
    return out


def _inputs(net_sets: dict, name: str):
    """The extracted model and a set's rows as its input tensor, as the extraction feeds them."""
    from PIL import Image
    from test_network_methods import KW

    from oodeval.data import Manifest
    from oodeval.features.backbones import load_backbone

    bb = load_backbone("test_resnet", net_sets["opts"]["weights"], model_kwargs=KW)
    model = bb.model.to(memory_format=torch.channels_last)
    paths = Manifest.from_csv(net_sets["paths"][name] / "manifest.csv").paths
    return model, torch.stack([bb.transform(Image.open(p).convert("RGB")) for p in paths]).contiguous(memory_format=torch.channels_last)


def _feature(model, x):
    return model.forward_head(model.forward_features(x), pre_logits=True)


def _openood_adascale_pass(model, data, o: float = 0.05, largest: bool = False):
    """AdaScalePostprocessor.postprocess / .perturb (openood/postprocessors/adascale_postprocessor.py at
    3c35632ee91b54b09d1f085d04f94744cece7d0b) re-derived up to the features: the gradient of the
    summed maximum logits, the int(C H W o) values of smallest |grad| moved by 0.5 sign(grad), the
    feature of each input. ``largest``: the largest |grad| perturbed, the deliberately wrong formula."""
    data = data.clone().requires_grad_(True)
    output = model(data)
    score = output[torch.arange(len(output)), output.detach().argmax(dim=1)]
    score.backward(torch.ones_like(score))
    grad = data.grad.detach()
    b, c, h, w = data.shape
    abs_grad = grad.abs().reshape(b, c * h * w)
    idx = torch.topk(abs_grad, int(c * h * w * o), dim=1, largest=largest)[1]
    mask = torch.zeros_like(abs_grad, dtype=torch.uint8).scatter_(1, idx, 1).reshape(b, c, h, w)
    with torch.no_grad():
        return _feature(model, data.detach()).numpy(), _feature(model, data.detach() + grad.sign() * mask * 0.5).numpy()


EPS32 = float(np.finfo(np.float32).eps)


def test_adascale_pass_is_openoods_perturbation(net_sets):
    model, x = _inputs(net_sets, "test")
    feature, perturbed = _openood_adascale_pass(model, x)
    test = net_sets["test"]
    assert test.meta["passes"]["adascale"] == {"kind": "adascale", "o": 0.05, "step": 0.5}
    # the same float32 operations on the same input: equal but for summation order inside the convolutions
    tol = 64 * EPS32 * np.abs(perturbed).max()
    np.testing.assert_allclose(test.features, feature, rtol=0, atol=tol)
    np.testing.assert_allclose(test.extras["adascale/features"], perturbed, rtol=0, atol=tol)
    assert np.abs(perturbed - feature).max() > 100 * tol  # the perturbation moves the features
    _, wrong = _openood_adascale_pass(model, x, largest=True)
    assert not np.allclose(test.extras["adascale/features"], wrong, rtol=0, atol=tol)


def _openood_adascale(train: FeatureSet, rows: FeatureSet, head: FeatureSet, k1=5, k2=1, lmbda=10.0, pct=(75, 85),
                      logit_scaling=False, flip_cdf=False) -> np.ndarray:  # fmt: skip
    """AdaScalePostprocessor.set_hyperparam / get_percentile / postprocess with AdaScaleANet /
    AdaScaleLNet.forward_threshold and ada_scale (openood/networks/adascale_net.py), at
    3c35632ee91b54b09d1f085d04f94744cece7d0b, re-derived in float64 torch on stored features (every
    fit row used: num_samples >= N): torch.topk / gather for the correction terms, the ECDF (fraction
    <=) of the fit rows, p = min + (1 - F) (max - min), ks = n - round(n p / 100), scale = sum /
    masked top-k sum; A: fc(feature * exp(scale)), L: fc(feature) * scale^2; logsumexp.
    ``flip_cdf``: p = min + F (max - min), the deliberately wrong formula."""
    t = lambda a: torch.from_numpy(np.asarray(a, dtype=np.float64))  # noqa: E731
    f_log, fp_log = t(train.features), t(train.extras["adascale/features"])
    d = f_log.shape[1]
    k1_, k2_ = int(d * k1 / 100), int(d * k2 / 100)

    def q(f, fp):
        top1 = torch.gather(torch.relu(fp), 1, torch.topk(f, dim=1, k=k1_)[1])
        top2 = torch.gather((f - fp).abs(), 1, torch.topk(f, dim=1, k=k2_)[1])
        return top1.sum(dim=1) + lmbda * top2.sum(dim=1)

    sample = np.sort(q(f_log, fp_log).numpy())
    feature, fp = t(rows.features), t(rows.extras["adascale/features"])
    cdf = np.searchsorted(sample, q(feature, fp).numpy(), side="right") / len(sample)
    percent = cdf if flip_cdf else 1 - cdf
    percentiles = torch.from_numpy(pct[0] + percent * (pct[1] - pct[0]))
    x = torch.relu(feature)
    n = x.shape[1]
    ks = n - torch.round(n * percentiles / 100.0).to(torch.int)
    values, _ = torch.topk(x, int(ks.max()), dim=1)
    mask = torch.arange(int(ks.max()))[None, :] < ks[:, None]
    scale = x.sum(dim=1, keepdim=True) / (values * mask).sum(dim=1, keepdim=True)
    fc = lambda z: z @ t(head.weight).T + t(head.bias)  # noqa: E731
    logits = fc(feature) * scale**2.0 if logit_scaling else fc(feature * torch.exp(scale))
    return torch.logsumexp(logits, dim=1).numpy()


@pytest.mark.parametrize("name", ["adascale_a", "adascale_l"])
@pytest.mark.parametrize("hp", [{}, {"k1": 10.0, "k2": 5.0, "lmbda": 2.0, "percentile": [60.0, 90.0]}])
def test_adascale_is_openoods_adascale(net_sets, name, hp):
    train, test, ood = net_sets["train"], net_sets["test"], net_sets["ood"]
    det = detectors.create(name, **hp).fit(train)
    ours = np.concatenate([det.score(test), det.score(ood)])
    ref_hp = {"k1": hp.get("k1", 5), "k2": hp.get("k2", 1), "lmbda": hp.get("lmbda", 10.0), "pct": hp.get("percentile", (75, 85)),
              "logit_scaling": name == "adascale_l"}  # fmt: skip
    ref = np.concatenate([_openood_adascale(train, s, train, **ref_hp) for s in (test, ood)])
    # float64 on both sides: sums of at most 96 terms and one log-sum-exp, a few float64 ulps of the scores
    np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=0)
    same_results(ours, ref, len(test))
    wrong = np.concatenate([_openood_adascale(train, s, train, **ref_hp, flip_cdf=True) for s in (test, ood)])
    assert not np.allclose(wrong, ref, rtol=1e-6, atol=0)
    assert len(np.unique(det.percentiles(test))) > 1  # the percentile does vary per sample


def test_adascale_subsamples_its_fit_rows_with_its_seed(net_sets):
    train = net_sets["train"]
    a, b = (detectors.create("adascale_a", num_samples=10, seed=s).fit(train) for s in (0, 1))
    assert len(a.reference_) == 10 and not np.array_equal(a.reference_, b.reference_)
    np.testing.assert_array_equal(a.reference_, detectors.create("adascale_a", num_samples=10).fit(train).reference_)
    with pytest.raises(InputError, match="holds the adascale pass with o=0.05"):
        detectors.create("adascale_a", o=0.1).fit(train)
    with pytest.raises(InputError, match="percentile must be"):
        detectors.create("adascale_l", percentile=[90.0, 80.0]).fit(train)


def _openood_iodin(model, data, std, t=1000.0, noise=0.5, every_value=False) -> np.ndarray:
    """IODINPostprocessor.postprocess (openood/postprocessors/iodin_postprocessor.py at
    3c35632ee91b54b09d1f085d04f94744cece7d0b) re-derived up to the perturbed logits: the mean
    cross-entropy of f / T against the argmax, the one value of largest |grad| per image (get_mask),
    (ge(grad, 0) - 0.5) 2 divided by each channel's std, x - noise * gradient * mask.
    ``every_value``: ODIN's perturbation of every value, the deliberately wrong formula."""
    data = data.clone().requires_grad_(True)
    output = model(data)
    loss = torch.nn.CrossEntropyLoss()(output / t, output.detach().argmax(axis=1))
    loss.backward()
    grad = data.grad.detach()
    b = grad.shape[0]
    abs_grad = grad.abs().reshape(b, -1)
    mask = torch.zeros_like(abs_grad, dtype=torch.uint8).scatter_(1, torch.argmax(abs_grad, dim=1, keepdim=True), 1).reshape(grad.shape)
    gradient = (torch.ge(grad, 0).float() - 0.5) * 2
    for ch in range(3):
        gradient[:, ch] = gradient[:, ch] / std[ch]
    with torch.no_grad():
        return model(data.detach() - noise * gradient * (1 if every_value else mask)).numpy()


def test_iodin_is_openoods_iodin(net_sets):
    model, x = _inputs(net_sets, "test")
    test = net_sets["test"]
    assert test.meta["passes"]["iodin"] == {"kind": "iodin", "temperature": 1000.0, "noise": 0.5, "std": [0.5, 0.5, 0.5]}
    want = _openood_iodin(model, x, [0.5, 0.5, 0.5])
    got = test.extras["iodin/logits"]
    tol = 64 * EPS32 * np.abs(want).max()  # the same float32 operations on the same input, up to summation order
    np.testing.assert_allclose(got, want, rtol=0, atol=tol)
    assert np.abs(got - test.logits).max() > 10 * tol  # the one value moved changes the logits
    assert not np.allclose(got, _openood_iodin(model, x, [0.5, 0.5, 0.5], every_value=True), rtol=0, atol=tol)
    # the score: OpenOOD's max softmax of the perturbed logits / T, float64 on the stored logits
    f = np.asarray(got, dtype=np.float64) / 1000.0
    ref = 1.0 / np.exp(f - f.max(axis=1, keepdims=True)).sum(axis=1)
    det = detectors.create("iodin").fit()
    np.testing.assert_allclose(det.score(test), ref, rtol=1e-14, atol=0)  # one float64 softmax, summed in another order
    assert det.resolved_params() == {"temperature": 1000.0, "noise": 0.5}
    with pytest.raises(InputError, match="holds the iodin pass with noise=0.5"):
        detectors.create("iodin", noise=0.0014).fit().score(test)


def test_the_passes_are_cached_and_run_in_score(net_sets, tmp_path, monkeypatch, capsys):
    from oodeval.cli import main
    from oodeval.features import passes as passes_mod
    from oodeval.features.extract import extract

    def never(*_a, **_k):
        raise AssertionError("a cached pass ran again")

    monkeypatch.setattr(passes_mod.AdaScalePass, "__call__", never)
    monkeypatch.setattr(passes_mod.IodinPass, "__call__", never)
    again = extract("test_resnet", net_sets["root"] / "test", net_sets["root"] / "store", passes=net_sets["specs"], **net_sets["opts"])
    assert FeatureSet.load(again).meta["key"] == net_sets["test"].meta["key"]
    dirs = {k: str(v) for k, v in net_sets["paths"].items()}
    out = tmp_path / "s.csv"
    assert main(["score", "--train", dirs["train"], "--test", dirs["test"], "--ood", f"ood={dirs['ood']}", "--draws", "0",
                 "--detectors", "adascale_a,adascale_l,iodin", "--out", str(out), "--format", "csv", "--no-progress"]) == 0  # fmt: skip
    table = pd.read_csv(out, comment="#")
    assert sorted(table["detector"]) == ["adascale_a", "adascale_l", "iodin"] and table["status"].eq("ok").all()


@pytest.mark.parametrize("name", ["deep_ensemble", "adascale_a", "adascale_l", "iodin"])
def test_listed_as_since_paper_with_openoods_name(name):
    from oodeval.commands.detectors import listing

    entries = {e["name"]: e for e in listing(["since-paper"])}
    assert {"openood", "network"} <= set(entries[name]["tags"]) and not entries[name]["default_selection"]
    if name == "deep_ensemble":  # OpenOOD's key differs: an alias with its source
        assert entries[name]["aliases"] == {"ensemble": "OpenOOD (since v1.5)"}
    assert OPENOOD in detectors.REGISTRY[name].__doc__ or OPENOOD in detectors.REGISTRY[name].__mro__[1].__doc__  # the release cited


def test_an_experiment_extracts_adascale_on_id_train_and_scores_both(net_sets, tmp_path):
    from oodeval.experiment import load_config, run_experiment
    from oodeval.results import load_results

    root = net_sets["root"]
    exp = tmp_path / "exp.toml"
    exp.write_text(f"""store = "{root / 'store'}"
results = "{tmp_path / 'r.parquet'}"
bootstrap_draws = 5
[datasets]
id_train = "{root / 'train'}"
id_test = "{root / 'test'}"
ood = [{{name = "{root / 'ood'}", label = "ood"}}]
[[models]]
name = "test_resnet"
weights = "{net_sets['opts']['weights']}"
model_kwargs = {{num_classes = 3, pretrained_cfg_overlay = {{input_size = [3, 48, 48]}}}}
adascale = true
iodin = {{noise = 0.5}}
detectors = ["adascale_a", "iodin"]
""")
    summary = run_experiment(load_config(exp), progress=False)
    rows = load_results(summary.results).set_index("detector")
    assert summary.ok and rows["status"].eq("ok").all(), summary.errors
    # ID train got the adascale pass only (what the fit reads); the scored sets are the entries extracted above
    det = detectors.create("adascale_a").fit(net_sets["train"])
    want = all_metrics(det.score(net_sets["test"]), det.score(net_sets["ood"]))["auroc"]
    assert rows.loc["adascale_a", "auroc"] == pytest.approx(want, abs=1e-12)


def test_the_passes_resume_and_key_each_setting(net_sets, tmp_path, monkeypatch):
    """Interrupted after one shard, a rerun computes only the rest, to the same arrays; a bad setting
    is refused naming it."""
    from oodeval.features import store as store_mod
    from oodeval.features.extract import extract
    from oodeval.features.pass_options import parse_pass

    opts = {**net_sets["opts"], "batch_size": 4, "shard_size": 4}
    folder, specs = net_sets["root"] / "test", net_sets["specs"]
    real, written = store_mod.write_shard, []

    def write_then_stop(path, *a, **k):
        real(path, *a, **k)
        written.append(path.name)
        raise KeyboardInterrupt

    monkeypatch.setattr(store_mod, "write_shard", write_then_stop)
    with pytest.raises(KeyboardInterrupt):
        extract("test_resnet", folder, tmp_path / "store", passes=specs, **opts)
    monkeypatch.setattr(store_mod, "write_shard", lambda path, *a, **k: (written.append(path.name), real(path, *a, **k)))
    resumed = FeatureSet.load(extract("test_resnet", folder, tmp_path / "store", passes=specs, **opts))
    assert written == ["shard-000000.npz", "shard-000001.npz", "shard-000002.npz"]  # 9 rows, 4 per shard: the first kept
    fresh = FeatureSet.load(extract("test_resnet", folder, tmp_path / "fresh", passes=specs, **opts))
    for key in ("adascale/features", "iodin/logits"):  # the same batches as one uninterrupted run of this batch size
        np.testing.assert_array_equal(resumed.extras[key], fresh.extras[key])
    with pytest.raises(InputError, match=r"adascale: o \(the fraction of input values perturbed\) must be in \(0, 1\], got 0"):
        parse_pass("adascale", "o=0")
