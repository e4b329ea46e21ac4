"""Every feature/logit-space method of OpenOOD v1.5's post-hoc table (``detectors.names("openood")``,
those needing a network pass excepted) runs in ``oodeval score`` and, all together, in ``oodeval run``
on the features of OpenOOD's random-init ResNet18_32x32 extracted from a generated OpenOOD data
root; the tables' metrics are those of the detector's own scores."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from test_data_openood import make_openood_root

from oodeval import cli, detectors
from oodeval.detectors import REGISTRY
from oodeval.features import FeatureSet
from oodeval.features.extract import extract
from oodeval.metrics import auroc, fpr_at_tpr

#: OpenOOD v1.5's openood/postprocessors/utils.py methods that apply to a standard classifier without
#: training or a network pass, under oodeval's name (OpenOOD's name where it differs)
OPENOOD_POST_HOC = {
    "msp": "msp", "energy": "ebo", "maxlogit": "mls", "kl_matching": "klm", "gen": "gen", "react": "react", "dice": "dice",
    "ash_b": "ash", "vra": "vra", "mahalanobis": "mds", "relative_mahalanobis": "rmds", "knn": "knn", "fdbd": "fdbd",
    "vim": "vim", "residual": "residual", "she": "she", "relation": "relation", "nci": "nci", "gmm": "gmm",
    "temperature_scaling": "temperature_scaling", "openmax": "openmax", "gradnorm": "gradnorm",
}  # fmt: skip
#: GROOD indexes the gradients of the ID-train rows the network classifies correctly: a random-init
#: network classifies none of the 18, so its fit refuses (tested below) rather than runs
POST_HOC = [n for n in detectors.names("openood") if "network" not in REGISTRY[n].tags and n != "grood"]
#: overrides an 18-image training set of a random-init network needs: kNN's k=1000 exceeds it; OpenMax fits its Weibull tails (20
#: per class) on correct predictions only, of which random weights make none; GMM's 50 components and 50 PCA axes exceed it;
#: CFOOD's 10% reference subset would be 1 row
SMALL = {"knn": {"k": 5}, "openmax": {"tailsize": 2, "correct_only": False}, "gmm": {"n_components": 3, "dim": 8}, "cfood": {"alpha": 1.0}}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("openood")
    make_openood_root(root, n_train=6, n_test=3, n_ood=3)
    lists = root / "benchmark_imglist" / "cifar10"
    out = {}
    for name, file in (("train", "train_cifar10.txt"), ("test", "test_cifar10.txt"), ("tin", "test_tin.txt"), ("svhn", "test_svhn.txt")):
        out[name] = extract("openood:resnet18_32x32", lists / file, root / "store", taps=True, device="cpu", progress=False)
    return out


def test_the_openood_tag_holds_every_applicable_post_hoc_method():
    missing = sorted(set(OPENOOD_POST_HOC) - set(detectors.names("openood")))
    assert not missing, f"OpenOOD post-hoc methods not tagged openood: {missing}"
    for ours, theirs in OPENOOD_POST_HOC.items():
        assert detectors.canonical(theirs) == ours


def test_the_features_are_resnet18_32x32s(folders):
    fs = FeatureSet.load(folders["train"])
    assert fs.features.shape == (18, 512) and fs.logits.shape == (18, 10) and fs.weight.shape == (10, 512)
    assert fs.meta["model"] == "openood:resnet18_32x32"


@pytest.mark.parametrize("name", POST_HOC)
def test_each_runs_in_score_on_resnet18_32x32_features(folders, name, tmp_path):
    out = tmp_path / "table.csv"
    sets = [f"{n}={folders[n]}" for n in ("tin", "svhn")]
    extra = [a for k, v in SMALL.get(name, {}).items() for a in ("--set", f"{name}.{k}={json.dumps(v)}")]
    argv = ["score", "--train", str(folders["train"]), "--test", str(folders["test"]), "--ood", *sets, "--detectors", name,
            *extra, "--draws", "0", "--out", str(out), "--no-progress", "--format", "csv"]
    assert cli.main(argv) == 0
    table = pd.read_csv(out, comment="#")
    assert list(table["ood"]) == ["tin", "svhn"] and (table["detector"] == name).all()
    train, test = FeatureSet.load(folders["train"]), FeatureSet.load(folders["test"])
    det = detectors.create(name, **SMALL.get(name, {})).fit(train)
    s_id = det.score(test)
    assert s_id.shape == (9,) and np.isfinite(s_id).all()
    for _, row in table.iterrows():
        s_ood = det.score(FeatureSet.load(folders[row.ood]))
        assert np.isfinite(s_ood).all()
        assert row.auroc == pytest.approx(auroc(s_id, s_ood), abs=1e-12)
        assert row.fpr95 == pytest.approx(fpr_at_tpr(s_id, s_ood), abs=1e-12)


def test_grood_without_a_correct_id_train_row_is_a_clear_error(folders, tmp_path):
    out = tmp_path / "table.csv"
    argv = ["score", "--train", str(folders["train"]), "--test", str(folders["test"]), "--ood", f"tin={folders['tin']}",
            "--detectors", "grood", "--draws", "0", "--out", str(out), "--no-progress", "--format", "csv"]
    assert cli.main(argv) == 1
    table = pd.read_csv(out, comment="#")
    assert (table["status"] == "error").all()
    assert table["error"].str.contains("no ID-train row is classified as its label").all()


def test_all_run_in_one_experiment_grid_on_resnet18_32x32_features(folders, tmp_path):
    feats = ", ".join(f'{role} = "{folders[name]}"' for role, name in (("id_train", "train"), ("id_test", "test"), ("tin", "tin"), ("svhn", "svhn")))
    entries = "\n".join(f"[[detectors]]\nname = \"{n}\"\nhyperparameters = {json.dumps(SMALL.get(n, {})).replace(':', ' =')}\n" for n in POST_HOC)
    exp = tmp_path / "exp.toml"
    exp.write_text(f"""
results = "{tmp_path / 'results.parquet'}"
seeds = [0]
bootstrap_draws = 10
[datasets]
id_train = "train"
id_test = "test"
ood = ["tin", "svhn"]
[[models]]
name = "openood:resnet18_32x32"
pretrained = false
features = {{ {feats} }}
{entries}""")
    assert cli.main(["run", str(exp), "--no-progress"]) == 0
    table = pd.read_parquet(tmp_path / "results.parquet")
    assert (table["status"] == "ok").all() and sorted(table["detector"]) == sorted(POST_HOC * 2)
    train, test = FeatureSet.load(folders["train"]), FeatureSet.load(folders["test"])
    for name, rows in table.groupby("detector"):
        det = detectors.create(name, **SMALL.get(name, {})).fit(train)
        s_id = det.score(test)
        for _, row in rows.iterrows():
            assert row.auroc == pytest.approx(auroc(s_id, det.score(FeatureSet.load(folders[row.dataset]))), abs=1e-12), name
