"""A detector from a plugin module declares a backbone default and a view, and every command
honours both through the one seam (oodeval.scorer_factory.build_scorer): ``score`` (CSV and Parquet),
``run`` (the grid and its validation search) and ``cnc evaluate``, with no other file changed."""

from __future__ import annotations

import json
import sys

import numpy as np
import pandas as pd
import pytest

from oodeval import cli, detectors
from oodeval.features import FeatureSet
from oodeval.metrics import auroc
from oodeval.results import load_cell_scores, load_results

PLUGIN = '''
import numpy as np

from oodeval.detectors.base import Default, Detector
from oodeval.errors import InputError


class OutlierLogit(Detector):
    """s = offset - scale * f_K: minus a K+1 model's outlier logit, read through the outlier class."""

    needs = ("logits",)
    reads_outlier_class = True

    @classmethod
    def backbone_defaults(cls, backbone):
        return {"scale": Default(3.0, f"issue28 plugin release ({backbone.family})")}

    def __init__(self, scale: float = 1.0, offset: float = 0.0) -> None:
        self.scale = scale
        self.offset = offset

    def _score(self, x):
        k = x.meta.get("outlier_class")
        if k is None:
            raise InputError("OutlierLogit was given the K-way view, not the outlier class it declares it reads")
        return self.offset - self.scale * np.asarray(x.logits, dtype=np.float64)[:, k]
'''
NAME = "issue28_plugin:OutlierLogit"
K = 3


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """``issue28_plugin.py`` in a folder on sys.path; the detector registry restored afterwards."""
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "issue28_plugin.py").write_text(PLUGIN)
    reg = detectors.REGISTRY
    reg.names()  # load the built-ins before taking the copy
    for attr in ("_classes", "_tags", "_order"):
        monkeypatch.setattr(reg, attr, dict(getattr(reg, attr)))
    monkeypatch.delitem(sys.modules, "issue28_plugin", raising=False)
    monkeypatch.syspath_prepend(str(folder))
    return tmp_path


def _k_plus_one(n: int, outlier_logit: float, seed: int, labelled: bool = True) -> FeatureSet:
    """A K+1 (CnC) model's FeatureSet of a resnet18: K ID logits around 0, the outlier logit around ``outlier_logit``."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, K + 1)).astype(np.float32)
    logits[:, K] += outlier_logit
    meta = {"model": "resnet18", "cnc": True, "num_id_classes": K, "outlier_class": K}
    return FeatureSet(features=rng.normal(size=(n, 4)).astype(np.float32), labels=rng.integers(0, K, n) if labelled else None,
                      logits=logits, meta=meta)  # fmt: skip


def _sets(root) -> dict[str, str]:
    sets = {"id_train": _k_plus_one(30, -4.0, 0), "id_test": _k_plus_one(30, -4.0, 1), "far": _k_plus_one(20, 4.0, 2, False),
            "validation_id": _k_plus_one(20, -4.0, 3), "validation_ood": _k_plus_one(20, 4.0, 4, False)}  # fmt: skip
    return {role: str(fs.save(root / role)) for role, fs in sets.items()}


def _resolved(row) -> dict:
    return json.loads(row["hyperparameters_resolved"])


def test_score_csv_and_parquet_apply_the_plugins_default_and_view(plugin, capsys):
    paths = _sets(plugin / "feats")
    base = ["score", "--train", paths["id_train"], "--test", paths["id_test"], "--ood", f"far={paths['far']}",
            "--detectors", NAME, "--draws", "20", "--no-progress"]  # fmt: skip
    assert cli.main([*base, "--out", str(plugin / "s.csv")]) == 0
    assert f"{NAME}.scale = 3.0  [issue28 plugin release (resnet)]" in capsys.readouterr().out  # the default, with its source
    row = pd.read_csv(plugin / "s.csv", comment="#").iloc[0]
    assert (row["status"], row["backbone"], row["hyperparameters"]) == ("ok", "resnet", "{}")
    assert _resolved(row)["scale"] == 3.0  # the backbone default, not the class's 1.0
    # the outlier logit was read (the K-way view raises): it separates ID from OOD completely
    test, far = FeatureSet.load(paths["id_test"]), FeatureSet.load(paths["far"])
    assert row["auroc"] == auroc(-test.logits[:, K].astype(np.float64), -far.logits[:, K].astype(np.float64)) == 1.0
    assert cli.main([*base, "--out", str(plugin / "s.parquet")]) == 0
    grid = load_results(plugin / "s.parquet").iloc[0]
    assert (grid["status"], grid["auroc"], grid["hyperparameters_resolved"]) == ("ok", 1.0, row["hyperparameters_resolved"])
    capsys.readouterr()


def test_grid_and_validation_search_apply_the_plugins_default_and_view(plugin, capsys):
    paths = _sets(plugin / "feats")
    exp = plugin / "exp.toml"
    feats = ", ".join(f'{role} = "{path}"' for role, path in paths.items())
    exp.write_text(
        f'results = "{plugin / "r.parquet"}"\nbootstrap_draws = 20\n'
        '[datasets]\nid_train = "t"\nid_test = "v"\nood = ["far"]\n'
        '[selection]\nvalidation_id = "vid"\nvalidation_ood = "vood"\n'
        f'[[models]]\nname = "cnc-resnet18"\nfeatures = {{ {feats} }}\n'
        f'[[detectors]]\nname = "{NAME}"\nhyperparameters = {{ offset = 0.5 }}\n'
        f'[[detectors]]\nname = "{NAME}"\nsearch = {{ offset = [0.0, 1.0] }}\n'
    )  # fmt: skip
    assert cli.main(["run", str(exp), "--no-progress"]) == 0
    df = load_results(plugin / "r.parquet")
    assert len(df) == 2 and (df["status"] == "ok").all() and (df["backbone"] == "resnet").all()
    plain, searched = df[df["selection"].isna()].iloc[0], df[df["selection"].notna()].iloc[0]
    assert plain["hyperparameters"] == '{"offset":0.5}' and _resolved(plain) == {"scale": 3.0, "offset": 0.5}
    # the search fitted and scored each candidate through the same seam: its view and default hold there too
    assert searched["selection"].startswith("validation: offset=0.0 chosen from offset in [0.0, 1.0]")
    assert _resolved(searched) == {"scale": 3.0, "offset": 0.0}
    test = FeatureSet.load(paths["id_test"])
    id_scores, _ = load_cell_scores(plain, plugin / "r.parquet")
    np.testing.assert_array_equal(id_scores, 0.5 - 3.0 * test.logits[:, K].astype(np.float64))
    capsys.readouterr()


def test_cnc_evaluate_applies_the_plugins_default_and_view(plugin, capsys):
    rng = np.random.default_rng(0)
    labels = np.arange(48) % K
    images = rng.integers(0, 50, size=(48, 12, 12), dtype=np.uint8)
    for i, c in enumerate(labels):
        images[i, c * 4 : c * 4 + 3] = 220
    np.savez(plugin / "train.npz", images=images, labels=labels)
    np.savez(plugin / "ood.npz", images=rng.integers(0, 256, size=(20, 12, 12), dtype=np.uint8))
    ck = plugin / "ck"
    assert cli.main(["cnc", "train", "--dataset", str(plugin / "train.npz"), "--out", str(ck), "--model", "test_resnet",
                     "--epochs", "1", "--batch-size", "16", "--no-progress", "--corruptions", "contrast,pixelate"]) == 0  # fmt: skip
    results = plugin / "cnc.parquet"
    assert cli.main(["cnc", "evaluate", "--checkpoint", str(ck), "--id-test", str(plugin / "train.npz"), "--ood", str(plugin / "ood.npz"),
                     "--detectors", f"{NAME},msp", "--results", str(results), "--draws", "10", "--no-progress"]) == 0  # fmt: skip
    df = load_results(results).set_index("detector")
    mine = df.loc[NAME]
    assert mine["status"] == "ok" and mine["hyperparameters"] == "{}"  # it read the outlier class (the K-way view raises)
    assert _resolved(mine)["scale"] == 3.0  # cnc evaluate applies the backbone defaults too
    assert mine["backbone"] == df.loc["msp", "backbone"] != "unknown"
    capsys.readouterr()
