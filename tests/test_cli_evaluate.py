"""One command from images to a table (``oodeval evaluate``) and ``--format table|csv|json`` on
stdout for ``evaluate``, ``score``, ``metrics`` and ``run``; ``metrics`` reads ``-`` as stdin."""

from __future__ import annotations

import io
import json

import numpy as np
import pandas as pd
import pytest
from test_grid_e2e import make_data

from oodeval import cli, detectors
from oodeval.features import FeatureSet
from oodeval.metrics import auroc, fpr_at_tpr, fpr_ood_positive

KW = '{"num_classes": 3}'


@pytest.fixture(scope="module")
def run_once(tmp_path_factory):
    """``oodeval evaluate --format json`` on generated images with a random-init tiny timm model."""
    tmp = tmp_path_factory.mktemp("evaluate")
    make_data(tmp / "data")
    d = tmp / "data"
    argv = ["evaluate", "--model", "test_resnet", "--pretrained", "none", "--model-kwargs", KW, "--train", str(d / "train"),
            "--test", str(d / "val"), "--ood", str(d / "gray"), f"fi={d / 'fi' / 'manifest.csv'}", "--detectors", "msp,energy,knn",
            "--set", "knn.k=3", "--store", str(tmp / "store"), "--draws", "100", "--device", "cpu", "--no-progress", "--format", "json"]  # fmt: skip
    return tmp, argv


def _call(argv, capsys):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_evaluate_end_to_end_json_equals_the_detectors_own_scores(run_once, capsys):
    tmp, argv = run_once
    code, out, err = _call(argv, capsys)
    assert code == 0, err
    rows = json.loads(out)  # stdout is pure JSON; the notes went to stderr
    assert "RANDOM-INIT" in err
    assert {(r["detector"], r["ood"]) for r in rows} == {(d, o) for d in ("msp", "energy", "knn") for o in ("gray", "fi")}
    store = {FeatureSet.load(p.parent).meta["dataset"]: p.parent for p in (tmp / "store").rglob("meta.json")}
    assert len(store) == 4  # train, val, gray, fi: one extraction each
    train, test = FeatureSet.load(store["train"]), FeatureSet.load(store["val"])
    gray = FeatureSet.load(next(v for k, v in store.items() if "gray" in k))
    det = detectors.create("knn", k=3).fit(train)
    ids, ood = det.score(test), det.score(gray)
    r = next(r for r in rows if r["detector"] == "knn" and r["ood"] == "gray")
    assert r["fpr95"] == fpr_at_tpr(ids, ood) and r["fpr95_ood_positive"] == fpr_ood_positive(ids, ood)
    assert r["auroc"] == auroc(ids, ood) and r["n_id"] == 12 and r["n_ood"] == 14
    assert r["fpr95_lo"] <= r["fpr95"] <= r["fpr95_hi"]
    # a rerun extracts nothing and prints the same rows
    before = sorted(p.stat().st_mtime_ns for p in (tmp / "store").rglob("meta.json"))
    code, again, _ = _call(argv, capsys)
    assert code == 0 and sorted(p.stat().st_mtime_ns for p in (tmp / "store").rglob("meta.json")) == before
    strip = [{k: v for k, v in r.items() if not k.endswith("_seconds")} for r in json.loads(again)]
    assert strip == [{k: v for k, v in r.items() if not k.endswith("_seconds")} for r in rows]


def test_evaluate_table_csv_and_refusals(run_once, capsys):
    tmp, argv = run_once
    table = argv[:-2]
    code, out, _ = _call(table, capsys)
    assert code == 0 and "FPR@95 ID-pos / FPR@95 OOD-pos / AUROC (%) per OOD set" in out
    code, out, _ = _call([*table, "--format", "csv"], capsys)
    df = pd.read_csv(io.StringIO(out))
    assert code == 0 and len(df) == 6 and {"fpr95", "fpr95_ood_positive", "auroc_lo"} <= set(df.columns)
    no_weights = [a for a in argv if a not in ("--pretrained", "none")]
    code, _, err = _call(no_weights, capsys)
    assert code == 2 and "no weights chosen" in err
    code, _, err = _call([*table, "--set", "msp.temperature=abc"], capsys)
    assert code == 2 and "temperature='abc' must be a number > 0" in err
    code, _, err = _call([*table, "--ood", "gray=a", "gray=b"], capsys)
    assert code == 2 and "--ood name 'gray' given twice" in err


def test_score_format_csv_and_json_to_stdout(run_once, capsys):
    tmp, _ = run_once
    store = {FeatureSet.load(p.parent).meta["dataset"]: p.parent for p in (tmp / "store").rglob("meta.json")}
    gray = next(v for k, v in store.items() if "gray" in k)
    base = ["score", "--train", str(store["train"]), "--test", str(store["val"]), "--ood", f"gray={gray}", "--detectors", "msp",
            "--draws", "0", "--no-progress"]  # fmt: skip
    code, out, err = _call([*base, "--format", "json"], capsys)
    rows = json.loads(out)
    assert code == 0 and [(r["detector"], r["ood"]) for r in rows] == [("msp", "gray")]
    code, out, _ = _call([*base, "--format", "csv"], capsys)
    assert code == 0 and pd.read_csv(io.StringIO(out))["fpr95"].tolist() == [rows[0]["fpr95"]]
    code, _, err = _call([*base, "--out", "-"], capsys)
    assert code == 2 and "--format csv" in err and not (tmp / "-").exists()


def test_metrics_reads_stdin_and_writes_json(tmp_path, capsys, monkeypatch):
    rng = np.random.default_rng(0)
    ids, ood = rng.normal(1, 1, 300), rng.normal(0, 1, 200)
    np.save(tmp_path / "ood.npy", ood)
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(repr(float(v)) for v in ids) + "\n"))
    code, out, _ = _call(["metrics", "-", str(tmp_path / "ood.npy"), "--format", "json", "--draws", "200"], capsys)
    row = json.loads(out)[0]
    assert code == 0 and row["n_id"] == 300 and row["fpr95"] == fpr_at_tpr(ids, ood) and row["auroc"] == auroc(ids, ood)
    assert row["fpr95_ood_positive"] == fpr_ood_positive(ids, ood) and row["fpr95_lo"] < row["fpr95_hi"]
    code, _, err = _call(["metrics", "-", "-"], capsys)
    assert code == 2 and "only one of the two score files can be -" in err
    code, out, _ = _call(["metrics", str(tmp_path / "ood.npy"), str(tmp_path / "ood.npy"), "--draws", "0"], capsys)
    assert code == 0 and "no intervals (--draws 0)" in out


def test_run_writes_its_cells_as_json(tmp_path, capsys):
    make_data(tmp_path / "data")
    exp = tmp_path / "exp.toml"
    exp.write_text('seeds = [0, 1]\nbootstrap_draws = 20\ndevice = "cpu"\n[datasets]\nid_train = "data/train"\nid_test = "data/val"\n'
                   'ood = ["data/gray"]\n[[models]]\nname = "timm:test_resnet"\npretrained = false\nmodel_kwargs = { num_classes = 3 }\n'
                   '[[detectors]]\nname = "msp"\n[[detectors]]\nname = "energy"\n')  # fmt: skip
    code, out, err = _call(["run", str(exp), "--no-progress", "--format", "json"], capsys)
    rows = json.loads(out)
    assert code == 0 and "4 cells: 0 already done, 4 computed" in err
    assert "img" not in err and "extract" not in err  # --no-progress reaches the extraction inside run
    assert sorted((r["detector"], r["seed"]) for r in rows) == [("energy", 0), ("energy", 1), ("msp", 0), ("msp", 1)]
    code, out, _ = _call(["run", str(exp), "--no-progress", "--format", "table"], capsys)
    assert code == 0 and "4 cells: 4 already done" in out and "msp seed 1" in out and "energy seed 0" in out
