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
