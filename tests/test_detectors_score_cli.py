"""``oodeval score`` and ``oodeval.scoring.evaluate_detectors`` on FeatureSets written by the test."""

import pandas as pd
import pytest

from oodeval import detectors
from oodeval.cli import main
from oodeval.detectors._synthetic import synthetic_problem
from oodeval.features import FeatureSet
from oodeval.metrics import auroc, fpr_at_tpr
from oodeval.scoring import evaluate_detectors, parse_hyperparameters


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("fs")
    train, test, ood = synthetic_problem(n_classes=5, dim=16, n_train=300, n_test=80, n_ood=60, seed=3)
    near = FeatureSet(test.features[:40] * 0.5, logits=test.logits[:40] * 0.5, weight=test.weight,
                      bias=test.bias, extras={k: v[:40] for k, v in test.extras.items()})  # fmt: skip
    for name, fs in {"train": train, "test": test, "far": ood, "near": near}.items():
        fs.save(root / name)
    return root


def test_score_command_prints_table_and_writes_csv(folders, capsys, tmp_path):
    out = tmp_path / "res" / "table.csv"
    argv = ["score", "--train", str(folders / "train"), "--test", str(folders / "test"),
            "--ood", f"far={folders / 'far'}", "--ood", f"near={folders / 'near'}",
            "--set", "knn.k=5", "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    table = pd.read_csv(out)
    assert len(table) == 21 * 2 and set(table.detector) == set(detectors.names("paper21"))
    assert set(table.ood) == {"far", "near"}
    assert "FPR@95 / AUROC (%)" in printed and "relative_mahalanobis_pp" in printed
    # the CSV holds exactly the metrics of the detector's own scores
    train, test, far = (FeatureSet.load(folders / n) for n in ("train", "test", "far"))
    det = detectors.create("knn", k=5).fit(train)
    row = table[(table.detector == "knn") & (table.ood == "far")].iloc[0]
    assert row.auroc == pytest.approx(auroc(det.score(test), det.score(far)))
    assert row.fpr95 == pytest.approx(fpr_at_tpr(det.score(test), det.score(far)))
    assert f"{100 * row.fpr95:.2f} / {100 * row.auroc:.2f}" in " ".join(printed.split())


def test_detector_subset_and_support(folders):
    train, test, far = (FeatureSet.load(folders / n) for n in ("train", "test", "far"))
    bare = {"far": FeatureSet(far.features, logits=far.logits)}  # no head, no NAC states
    rows = evaluate_detectors(train, test, bare, progress=False, hyperparameters={"knn": {"k": 5}})
    names = {r["detector"] for r in rows}
    assert "nac" not in names and "dice" not in names and {"msp", "knn", "mahalanobis"} <= names
    with pytest.warns(UserWarning, match="skipped detector knn: knn k=1000 exceeds"):
        rows = evaluate_detectors(train, test, bare, progress=False)  # default k on 300 rows
    assert "knn" not in {r["detector"] for r in rows} and len(rows) == len(names) - 1
    scores = {}
    rows = evaluate_detectors(train, test, {"far": far}, ["energy", "vim"], scores_out=scores, progress=False)
    assert [r["detector"] for r in rows] == ["energy", "vim"]
    assert scores["energy"]["id"].shape == (80,) and scores["vim"]["far"].shape == (60,)


def test_bad_input_gets_a_clear_error(folders, capsys):
    base = ["score", "--train", str(folders / "train"), "--test", str(folders / "test"), "--no-progress"]
    assert main(base + ["--ood", "far"]) == 2
    assert "NAME=DIR" in capsys.readouterr().err
    assert main(base + ["--ood", f"far={folders / 'far'}", "--detectors", "msp,bogus"]) == 2
    assert "bogus" in capsys.readouterr().err
    assert main(base + ["--ood", f"far={folders / 'far'}", "--detectors", "knn"]) == 2
    assert "k=1000 exceeds" in capsys.readouterr().err
    assert main(base + ["--ood", f"far={folders / 'nowhere'}"]) == 2
    with pytest.raises(ValueError, match="DETECTOR.NAME=VALUE"):
        parse_hyperparameters(["knn=3"])
    assert parse_hyperparameters(["knn.k=50", "neco.maxlogit=true", "nac.layers=[\"a\"]"]) == {
        "knn": {"k": 50}, "neco": {"maxlogit": True}, "nac": {"layers": ["a"]}}  # fmt: skip


def test_score_writes_a_results_table_that_report_reads(folders, tmp_path, capsys):
    out = tmp_path / "res" / "score.parquet"
    argv = ["score", "--train", str(folders / "train"), "--test", str(folders / "test"),
            "--ood", f"far={folders / 'far'}", "--ood", f"near={folders / 'near'}",
            "--detectors", "msp,knn,vim", "--set", "knn.k=5", "--draws", "50", "--no-progress"]  # fmt: skip
    assert main([*argv, "--out", str(out)]) == 0
    assert main([*argv, "--out", str(tmp_path / "score.csv")]) == 0
    table, csv = pd.read_parquet(out), pd.read_csv(tmp_path / "score.csv")
    ok = table[(table.status == "ok") & (table.split == "all")]
    assert sorted(zip(ok.detector, ok.dataset)) == sorted(zip(csv.detector, csv.ood))
    for r in csv.itertuples():  # the same cells, the same numbers as the CSV's
        cell = ok[(ok.detector == r.detector) & (ok.dataset == r.ood)].iloc[0]
        assert (cell.fpr95, cell.auroc) == pytest.approx((r.fpr95, r.auroc), abs=1e-15)
        assert cell.fpr95_lo <= cell.fpr95 <= cell.fpr95_hi
    assert set(ok[ok.detector == "knn"].hyperparameters) == {'{"k":5}'}
    capsys.readouterr()
    assert main([*argv, "--out", str(out)]) == 0  # a rerun computes nothing new
    assert "0 cells computed, 6 already there" in capsys.readouterr().out
    assert main(["report", str(out), "--out", str(tmp_path / "report"), "--draws", "20"]) == 0
    html = (tmp_path / "report" / "report.html").read_text()
    assert all(d in html for d in ("msp", "knn", "vim"))
    assert main([*argv[:-1], "--draws", "0", "--out", str(tmp_path / "zero.parquet")]) == 2
    assert "--draws must be at least 1" in capsys.readouterr().err
