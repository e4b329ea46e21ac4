"""Both FPR@95 conventions, named, in every output: the papers' (ID positive, ``fpr95``) and
OpenOOD's / pytorch-ood's (OOD positive, ``fpr95_ood_positive``) on one hand-made case whose
values follow by counting (docs/detectors.md "Two FPR@95 conventions")."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import oodeval
from oodeval.cli import main
from oodeval.features import FeatureSet
from oodeval.metrics import all_metrics, fpr_ood_positive
from oodeval.results import load_results
from oodeval.stats import bootstrap

pytestmark = pytest.mark.numerics  # run again under other CPU kernels (docs/conventions.md#reproducibility)

# 20 ID and 20 OOD scores (the max logit of a two-class head [s, 0]).
# Paper: keep 19 of 20 ID (95%) -> t = 16 -> OOD >= 16: 16, 17, 20.5, 25.5, 40 = 5 of 20 = 25%.
# OOD positive: catch 19 of 20 OOD -> t = 25.5 -> ID <= 25.5: 5, 16..25 = 11 of 20 = 55%.
ID = np.r_[5.0, np.arange(16.0, 35.0)]
OOD = np.r_[np.arange(1.0, 18.0), 20.5, 25.5, 40.0]
PAPER, OOD_POSITIVE = 0.25, 0.55


def _fs(scores: np.ndarray, labels: np.ndarray | None = None) -> FeatureSet:
    logits = np.stack([scores, np.zeros_like(scores)], axis=1)
    return FeatureSet(np.stack([scores, -scores], axis=1).astype(np.float32), labels=labels, logits=logits,
                      meta={"model": "hand-made"})  # fmt: skip


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("conv")
    _fs(ID, np.zeros(ID.size, dtype=np.int64)).save(root / "train")
    _fs(ID, np.zeros(ID.size, dtype=np.int64)).save(root / "test")
    _fs(OOD).save(root / "ood")
    return root


def test_the_hand_made_values_and_their_bootstrap():
    got = all_metrics(ID, OOD)
    assert got["fpr95"] == PAPER and got["fpr95_ood_positive"] == OOD_POSITIVE
    assert fpr_ood_positive(ID, OOD) == OOD_POSITIVE
    # every OOD-resampled draw equals the metric of that resample (ID fixed)
    boot = bootstrap(ID, OOD, draws=300, seed=1)
    again = [fpr_ood_positive(ID, OOD[i]) for i in boot["ood_index"]]
    np.testing.assert_array_equal(boot["fpr95_ood_positive"][0], again)
    both = bootstrap(ID, OOD, draws=300, seed=1, fixed_id=False)["fpr95_ood_positive"][0]
    assert np.all(np.isin(np.round(both * 20), np.arange(21)))  # a share of the 20 ID scores


def test_python_api(folders):
    df = oodeval.evaluate(train=folders / "train", id=folders / "test", ood={"x": folders / "ood"}, detectors=["maxlogit"], draws=200)
    row = df.iloc[0]
    assert (row["fpr95"], row["fpr95_ood_positive"]) == (PAPER, OOD_POSITIVE)
    assert row["fpr95_ood_positive_lo"] <= OOD_POSITIVE <= row["fpr95_ood_positive_hi"]
    assert row["fpr95_ood_positive_lo"] < row["fpr95_ood_positive_hi"]


def _score(folders, *extra: str) -> list[str]:
    return ["score", "--train", str(folders / "train"), "--test", str(folders / "test"), "--ood", f"x={folders / 'ood'}",
            "--detectors", "maxlogit", "--draws", "200", "--no-progress", *extra]  # fmt: skip


def test_score_csv_and_console(folders, tmp_path, capsys):
    out = tmp_path / "s.csv"
    assert main(_score(folders, "--out", str(out))) == 0
    printed = capsys.readouterr().out
    assert "FPR@95 ID-pos / FPR@95 OOD-pos / AUROC (%)" in printed and "25.00 / 55.00 / " in printed
    row = pd.read_csv(out, comment="#").iloc[0]
    assert (row["fpr95"], row["fpr95_ood_positive"]) == (PAPER, OOD_POSITIVE)
    assert main(_score(folders, "--convention", "openood")) == 0
    printed = capsys.readouterr().out
    assert "FPR@95 OOD-pos / FPR@95 ID-pos / AUROC (%)" in printed and "55.00 / 25.00 / " in printed


def test_metrics_console(tmp_path, capsys):
    np.save(tmp_path / "id.npy", ID)
    np.save(tmp_path / "ood.npy", OOD)
    assert main(["metrics", str(tmp_path / "id.npy"), str(tmp_path / "ood.npy"), "--draws", "200"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.split()[:2] == ["fpr95", "25.00%"] for line in lines)
    assert any(line.split()[:2] == ["fpr95_ood_positive", "55.00%"] for line in lines)
    assert any(line.startswith("fpr95_ood_positive: FPR@95 OOD-pos") for line in lines)


def test_results_table_and_report(folders, tmp_path, capsys):
    table = tmp_path / "r.parquet"
    assert main(_score(folders, "--out", str(table))) == 0
    assert "25.00 / 55.00 / " in capsys.readouterr().out
    row = load_results(table).iloc[0]
    assert (row["fpr95"], row["fpr95_ood_positive"]) == (PAPER, OOD_POSITIVE)
    for convention, first in (("paper", "FPR@95"), ("openood", "FPR@95 OOD-pos")):
        out = tmp_path / f"report-{convention}"
        assert main(["report", str(table), "--out", str(out), "--draws", "20", "--convention", convention]) == 0
        md = (out / "report.md").read_text()
        head = next(line for line in md.splitlines() if line.startswith("| Group"))
        cols = [c.strip() for c in head.strip("|").split("|")]
        body = next(line for line in md.splitlines() if line.startswith("| supervised"))
        cells = dict(zip(cols, [c.strip().strip("*") for c in body.strip("|").split("|")]))
        assert cells["FPR@95"].startswith("25.0 [") and cells["FPR@95 OOD-pos"].startswith("55.0 [")
        assert [c for c in cols if c.startswith("FPR@95")][0] == first
    capsys.readouterr()


def test_an_older_table_without_the_column_still_loads(folders, tmp_path, capsys):
    table = tmp_path / "old.parquet"
    assert main(_score(folders, "--out", str(table))) == 0
    df = pd.read_parquet(table).drop(columns=[c for c in pd.read_parquet(table).columns if c.startswith("fpr95_ood_positive")])
    df.to_parquet(table, index=False)
    assert load_results(table)["fpr95_ood_positive"].isna().all()
    out = tmp_path / "rep"
    assert main(["report", str(table), "--out", str(out), "--draws", "20"]) == 0
    assert "55.0" in (out / "report.md").read_text()  # recomputed from the stored scores
    capsys.readouterr()
