"""A detector class of your own named ``module:Class`` in ``score --detectors`` and in an
experiment file, and the experiment file's own folder importable for ``module:factory``."""

from __future__ import annotations

import os

import pandas as pd
import pytest
from test_conventions import ID, OOD, _fs

from oodeval import cli, detectors
from oodeval.results import load_results

PLUGIN = '''
import numpy as np
from oodeval.detectors.base import Detector


class ScaledMaxLogit(Detector):
    """scale * max logit: the ranking (and every metric) of maxlogit for scale > 0."""

    needs = ("logits",)

    def __init__(self, scale: float = 2.0) -> None:
        self.scale = scale

    def _score(self, x):
        return self.scale * np.asarray(x.logits, dtype=np.float64).max(axis=1)


class NotADetector:
    pass


def factory():
    raise RuntimeError("only imported by --check")
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """``issue27_plugin.py`` in a fresh folder; the detector registry restored afterwards."""
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "issue27_plugin.py").write_text(PLUGIN)
    reg = detectors.REGISTRY
    reg.names()  # load the built-ins before taking the copy
    for attr in ("_classes", "_tags", "_order"):
        monkeypatch.setattr(reg, attr, dict(getattr(reg, attr)))
    monkeypatch.delitem(__import__("sys").modules, "issue27_plugin", raising=False)
    for name, scores in (("train", ID), ("test", ID), ("ood", OOD)):
        _fs(scores).save(tmp_path / name)
    return tmp_path, folder


def test_score_takes_a_module_class_detector(plugin, capsys, monkeypatch):
    tmp, folder = plugin
    base = ["score", "--train", str(tmp / "train"), "--test", str(tmp / "test"), "--ood", f"x={tmp / 'ood'}", "--draws", "0", "--no-progress"]
    assert cli.main([*base, "--detectors", "issue27_plugin:ScaledMaxLogit"]) == 2
    assert "cannot import 'issue27_plugin'" in capsys.readouterr().err  # not on the path yet: the error says how
    monkeypatch.syspath_prepend(str(folder))
    out = tmp / "s.csv"
    assert cli.main([*base, "--detectors", "issue27_plugin:ScaledMaxLogit,maxlogit", "--out", str(out)]) == 0
    capsys.readouterr()
    t = pd.read_csv(out, comment="#").set_index("detector")
    assert t.loc["issue27_plugin:ScaledMaxLogit", "fpr95"] == t.loc["maxlogit", "fpr95"] == 0.25
    assert t.loc["issue27_plugin:ScaledMaxLogit", "fpr95_ood_positive"] == 0.55
    assert "issue27_plugin:ScaledMaxLogit" not in detectors.default_names()  # named, never picked by default
    assert cli.main([*base, "--detectors", "issue27_plugin:NotADetector"]) == 2
    assert "is not a subclass of oodeval.detectors.base.Detector" in capsys.readouterr().err


def test_set_reaches_a_detector_class_of_a_dotted_module_path(plugin, capsys, monkeypatch):
    tmp, folder = plugin
    (folder / "issue27pkg").mkdir()
    (folder / "issue27pkg" / "__init__.py").write_text("")
    (folder / "issue27pkg" / "dets.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(folder))
    name = "issue27pkg.dets:ScaledMaxLogit"
    out = tmp / "s.csv"
    args = ["score", "--train", str(tmp / "train"), "--test", str(tmp / "test"), "--ood", f"x={tmp / 'ood'}", "--draws", "0",
            "--no-progress", "--detectors", name, "--set", f"{name}.scale=3.5", "--out", str(out)]  # fmt: skip
    assert cli.main(args) == 0
    capsys.readouterr()
    row = pd.read_csv(out, comment="#").set_index("detector").loc[name]
    assert '"scale":3.5' in row["hyperparameters"] and row["fpr95"] == 0.25


def _experiment(tmp, folder, results: str = "r.parquet"):
    exp = folder / "exp.toml"
    exp.write_text(
        f'results = "{tmp / results}"\nbootstrap_draws = 20\n'
        '[datasets]\nid_train = "t"\nid_test = "v"\nood = ["x"]\n'
        '[[models]]\nname = "issue27_plugin:factory"\nlabel = "hand"\n'
        f'features = {{ id_train = "{tmp / "train"}", id_test = "{tmp / "test"}", x = "{tmp / "ood"}" }}\n'
        '[[detectors]]\nname = "issue27_plugin:ScaledMaxLogit"\nhyperparameters = { scale = 3.0 }\n'
    )  # fmt: skip
    return exp


def test_experiment_folder_is_importable_for_factories_and_detector_classes(plugin, capsys):
    tmp, folder = plugin
    exp = _experiment(tmp, folder)
    assert cli.main(["run", str(exp), "--check"]) == 0  # module:factory and module:Class import without PYTHONPATH=.
    assert "check passed" in capsys.readouterr().out
    assert cli.main(["run", str(exp), "--no-progress"]) == 0
    df = load_results(tmp / "r.parquet")
    row = df[df["detector"] == "issue27_plugin:ScaledMaxLogit"].iloc[0]
    assert (row["status"], row["fpr95"], row["fpr95_ood_positive"]) == ("ok", 0.25, 0.55)
    assert '"scale":3.0' in row["hyperparameters"]
    capsys.readouterr()


def test_distributed_workers_import_the_experiment_folder_themselves(plugin, capsys):
    """A submitit local job is a new Python process: it starts without the coordinator's sys.path,
    so the job itself puts the experiment's folder there before it resolves ``issue27_plugin:...``."""
    import sys

    tmp, folder = plugin
    exp = _experiment(tmp, folder, "dist.parquet")
    assert str(folder) not in os.environ.get("PYTHONPATH", "")
    assert cli.main(["run", str(exp), "--no-progress", "--executor", "local", "--executor-option", "max_jobs=1"]) == 0, capsys.readouterr()
    assert str(folder) in sys.path  # the coordinator's own (load_config), which the job does not inherit
    row = load_results(tmp / "dist.parquet").set_index("detector").loc["issue27_plugin:ScaledMaxLogit"]
    assert (row["status"], row["fpr95"], row["fpr95_ood_positive"]) == ("ok", 0.25, 0.55)
