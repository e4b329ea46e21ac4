"""Full-spectrum OOD (OpenOOD v1.5's FSOOD mode): covariate-shifted ID sets counted as ID. The
``fs_*`` metrics of a run on a generated csID set equal OpenOOD's formula on the same scores."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.special import softmax
from sklearn import metrics as skm

from oodeval.errors import InputError
from oodeval.experiment import run_experiment
from oodeval.experiment.config import load_config
from oodeval.features import FeatureSet
from oodeval.metrics import full_spectrum_metrics
from oodeval.results import load_results

from test_grid_run import C, make_sets

# float64 ROC / PR areas over ~300 points: rounding far below 1e-12
TOL = 1e-12


def openood_fsood(id_conf, csid_confs, ood_conf):
    """OpenOOD v1.5 evaluators: in FSOOD mode the csID confidences join the ID side (label >= 0), OOD
    gets label -1; then metrics.compute_all_metrics: roc_curve with OOD positive on -conf, FPR at the
    first TPR >= 0.95, AUROC = auc(fpr, tpr), AUPR-In/-Out = auc(recall, precision)."""
    conf = np.concatenate([id_conf, *csid_confs, ood_conf])
    ood = np.r_[np.zeros(conf.size - ood_conf.size), np.ones(ood_conf.size)]
    fpr, tpr, _ = skm.roc_curve(ood, -conf)
    p_in, r_in, _ = skm.precision_recall_curve(1 - ood, conf)
    p_out, r_out, _ = skm.precision_recall_curve(ood, -conf)
    return {"fpr": fpr[np.argmax(tpr >= 0.95)], "auroc": skm.auc(fpr, tpr), "aupr_in": skm.auc(r_in, p_in), "aupr_out": skm.auc(r_out, p_out)}


def test_metric_equals_openood_formula_and_differs_from_standard():
    rng = np.random.default_rng(1)
    x, y = rng.normal(2, 1, 60), rng.normal(0, 1, 40)
    cs = [np.round(rng.normal(1, 1, 30), 1), rng.normal(0.5, 1, 20)]  # shifted ID scores lie between, some tied
    got = full_spectrum_metrics(x, cs, y)
    want = openood_fsood(x, cs, y)
    assert got["fs_fpr95_ood_positive"] == pytest.approx(want["fpr"], abs=TOL)
    assert got["fs_auroc"] == pytest.approx(want["auroc"], abs=TOL)
    assert got["fs_aupr_in_trapezoid"] == pytest.approx(want["aupr_in"], abs=TOL)
    assert got["fs_aupr_out_trapezoid"] == pytest.approx(want["aupr_out"], abs=TOL)
    # csID scored lower than ID makes full-spectrum detection harder than the standard one
    standard = openood_fsood(x, [], y)
    assert got["fs_auroc"] < standard["auroc"] - 0.01
    with pytest.raises(InputError, match="csID"):
        full_spectrum_metrics(x, [], y)


def _csid_set(root, paths, n: int = 40) -> str:
    """A covariate-shifted ID set: the ID-train class means, shifted and noisier, through the same head."""
    train = FeatureSet.load(paths["id_train"])
    W, b = np.asarray(train.weight), np.asarray(train.bias)
    mu = np.stack([np.asarray(train.features)[train.labels == c].mean(axis=0) for c in range(C)])
    rng = np.random.default_rng(3)
    y = rng.integers(0, C, n)
    z = (mu[y] + 0.8 + 1.7 * rng.normal(size=(n, mu.shape[1]))).astype(np.float32)
    return str(FeatureSet(features=z, labels=y, logits=z @ W.T + b, weight=W, bias=b).save(root / "feats" / "shifted"))


def test_full_spectrum_run(tmp_path):
    paths = make_sets(tmp_path)
    paths["shifted"] = _csid_set(tmp_path, paths)
    cfg = {
        "seeds": [0], "bootstrap_draws": 200, "results": str(tmp_path / "out" / "results.parquet"),
        "datasets": {"id_train": "train", "id_test": "test", "ood": ["near", "far"], "csid": ["shifted"]},
        "models": [{"name": "synthetic", "features": paths}], "detectors": ["msp", "energy"],
    }  # fmt: skip
    summary = run_experiment(cfg, progress=False)
    df = load_results(summary.results)
    assert (df["status"] == "ok").all() and set(df["csid"]) == {"shifted"}
    test, near, shifted = (FeatureSet.load(paths[k]) for k in ("id_test", "near", "shifted"))
    msp = {k: softmax(np.asarray(fs.logits, np.float64), axis=1).max(axis=1) for k, fs in (("id", test), ("near", near), ("cs", shifted))}
    row = df[(df["detector"] == "msp") & (df["dataset"] == "near")].iloc[0]
    want = openood_fsood(msp["id"], [msp["cs"]], msp["near"])
    # rank-based metrics of the same scores (the detector's float32 softmax keeps their order here)
    assert row["fs_fpr95_ood_positive"] == pytest.approx(want["fpr"], abs=TOL)
    assert row["fs_auroc"] == pytest.approx(want["auroc"], abs=TOL)
    assert row["fs_aupr_in_trapezoid"] == pytest.approx(want["aupr_in"], abs=TOL)
    assert row["auroc"] == pytest.approx(openood_fsood(msp["id"], [], msp["near"])["auroc"], abs=TOL)
    acc = float((np.asarray(shifted.logits).argmax(1) == shifted.labels).mean())
    assert json.loads(row["csid_accuracy"]) == {"shifted": pytest.approx(acc, abs=TOL)}


def test_csid_labels_checked():
    base = {"datasets": {"id_train": "a", "id_test": "b", "ood": ["c"], "csid": ["c"]}, "models": [{"name": "resnet18"}]}
    with pytest.raises(InputError, match="csID label"):
        load_config(base)


def test_openood_benchmark_read_as_it_lies_names_its_csid_lists(tmp_path):
    from test_data_openood import make_openood_root

    from oodeval.data.openood import experiment_datasets, read_imglist

    make_openood_root(tmp_path)
    lists = tmp_path / "benchmark_imglist" / "cifar10"
    (tmp_path / "images_classic" / "cifar10c").mkdir(parents=True)
    (tmp_path / "images_classic" / "cifar10c" / "0.png").write_bytes((tmp_path / "images_classic" / "cifar10" / "test" / "0_0.png").read_bytes())
    (lists / "test_cifar10c.txt").write_text("cifar10c/0.png 2\n")
    assert "csid" not in experiment_datasets(tmp_path, "cifar10")
    table = experiment_datasets(tmp_path, "cifar10", full_spectrum=True)
    assert table["csid"] == [{"name": str(lists / "test_cifar10c.txt"), "label": "cifar10c"}]
    assert list(read_imglist(lists / "test_cifar10c.txt").labels) == [2]  # csID keeps its class labels (accuracy there)
    with pytest.raises(InputError, match="no covariate-shifted ID lists"):
        make_openood_root(tmp_path / "c100", "cifar100")
        experiment_datasets(tmp_path / "c100", "cifar100", full_spectrum=True)
    cfg = load_config({"openood": {"benchmark": "cifar10", "root": str(tmp_path), "full_spectrum": True},
                       "models": [{"name": "resnet18", "pretrained": False}]})  # fmt: skip
    assert [d.label for d in cfg.csid] == ["cifar10c"]
