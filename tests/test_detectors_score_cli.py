"""``oodeval score`` and ``oodeval.evaluation.evaluate_detectors`` on FeatureSets written by the test."""

import numpy as np
import pandas as pd
import pytest

from oodeval import detectors
from oodeval.cli import main
from oodeval.detectors._synthetic import synthetic_problem
from oodeval.features import FeatureSet
from oodeval.metrics import auroc, fpr_at_tpr
from oodeval.evaluation import evaluate_detectors, parse_hyperparameters


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
    table = pd.read_csv(out, comment="#")
    assert len(table) == 21 * 2 and set(table.detector) == set(detectors.names("paper21"))
    assert set(table.ood) == {"far", "near"}
    assert "FPR@95 ID-pos / FPR@95 OOD-pos / AUROC (%)" in printed and "relative_mahalanobis_pp" in printed
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
    rows = evaluate_detectors(train, test, bare, progress=False)  # default k on 300 rows
    failed = [r for r in rows if r["status"] == "error"]
    assert [(r["detector"], r["ood"]) for r in failed] == [("knn", "far")] and "detector 'knn': k=1000 exceeds" in failed[0]["error"]
    assert {r["detector"] for r in rows if r["status"] == "ok"} == names - {"knn"}
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
    assert main(base + ["--ood", f"far={folders / 'far'}", "--detectors", "knn"]) == 1
    out, err = capsys.readouterr()
    assert "knn / far: fit on the ID-train set: detector 'knn': k=1000 exceeds" in err and "failed" in out
    assert main(base + ["--ood", f"far={folders / 'far'}", "--set", "knn.kk=5"]) == 2
    assert "detector 'knn' has no hyperparameter(s) kk (did you mean k?); it takes:" in capsys.readouterr().err
    assert main(base + ["--ood", f"far={folders / 'nowhere'}"]) == 2
    with pytest.raises(ValueError, match="DETECTOR.NAME=VALUE"):
        parse_hyperparameters(["knn=3"])
    assert parse_hyperparameters(["knn.k=50", "neco.maxlogit=true", "nac.layers=[\"a\"]"]) == {
        "knn": {"k": 50}, "neco": {"maxlogit": True}, "nac": {"layers": ["a"]}}  # fmt: skip
    # a module:Class detector's dotted module path: the parameter is after the last dot after the colon
    assert parse_hyperparameters(["mypkg.sub:MyDet.k=5", "mypkg.sub:MyDet.t=0.5", "plain:Det.k=1"]) == {
        "mypkg.sub:MyDet": {"k": 5, "t": 0.5}, "plain:Det": {"k": 1}}  # fmt: skip
    for bad in ("mypkg.sub:MyDet=5", "mypkg:MyDet=5"):  # no parameter after the class
        with pytest.raises(ValueError, match="DETECTOR.NAME=VALUE"):
            parse_hyperparameters([bad])


def test_a_failing_set_is_that_detectors_failure_and_the_run_goes_on(folders, capsys, tmp_path):
    """A mismatched OOD set (other feature dimension / other head) and a NaN row: each is recorded
    for the detectors that read it, every other result is computed, and the exit status is 1."""
    far = FeatureSet.load(folders / "far")
    narrow = FeatureSet(far.features[:, :12], logits=far.logits, weight=far.weight[:, :12], bias=far.bias, meta={"dataset": "narrow"})
    other_head = FeatureSet(far.features, logits=far.logits, weight=far.weight * 2, bias=far.bias, meta={"dataset": "other-head"})
    logits = np.array(far.logits)
    logits[7, 0] = np.inf
    inf_row = FeatureSet(far.features, logits=logits, weight=far.weight, bias=far.bias, meta={"dataset": "inf-row"})
    for name, fs in {"narrow": narrow, "head": other_head, "inf": inf_row}.items():
        fs.save(tmp_path / name)
    argv = ["score", "--train", str(folders / "train"), "--test", str(folders / "test"), "--no-progress",
            "--detectors", "msp,energy,knn,nnguide,react", "--set", "knn.k=5",
            "--ood", f"narrow={tmp_path / 'narrow'}", "--ood", f"head={tmp_path / 'head'}", "--ood", f"inf={tmp_path / 'inf'}",
            "--out", str(tmp_path / "t.csv")]  # fmt: skip
    assert main(argv) == 1
    err = capsys.readouterr().err
    table = pd.read_csv(tmp_path / "t.csv", comment="#").set_index(["detector", "ood"])
    status = table["status"].to_dict()
    # every detector compared each set with its ID-train set: the narrow one and the other head fail
    for det in ("msp", "energy", "knn", "nnguide", "react"):
        assert status[(det, "narrow")] == "error" and status[(det, "head")] == "error"
        assert "feature dimension 12 vs 16" in table.loc[(det, "narrow"), "error"]
        assert "does not match the ID-train set" in table.loc[(det, "head"), "error"]
    # the inf logit breaks the detectors that read logits, not knn or react (features + head)
    assert {d for d in ("msp", "energy", "knn", "nnguide", "react") if status[(d, "inf")] == "error"} == {"msp", "energy", "nnguide"}
    assert "logits has 1 non-finite value (first in row 7)" in table.loc[("energy", "inf"), "error"]
    assert "AssertionError" not in err and "13 of 15 (detector, OOD set) results failed" in err


def test_score_writes_a_results_table_that_report_reads(folders, tmp_path, capsys):
    out = tmp_path / "res" / "score.parquet"
    argv = ["score", "--train", str(folders / "train"), "--test", str(folders / "test"),
            "--ood", f"far={folders / 'far'}", "--ood", f"near={folders / 'near'}",
            "--detectors", "msp,knn,vim", "--set", "knn.k=5", "--draws", "50", "--no-progress"]  # fmt: skip
    assert main([*argv, "--out", str(out)]) == 0
    assert main([*argv, "--out", str(tmp_path / "score.csv")]) == 0
    table, csv = pd.read_parquet(out), pd.read_csv(tmp_path / "score.csv", comment="#")
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


def test_score_csv_and_grid_give_identical_numbers(folders, tmp_path):
    """The CSV (`score`'s own run) and the results table (the grid) are one loop: every metric,
    every bootstrap bound and the explicit and resolved hyperparameters are equal to the bit, and both
    tables take their columns from one row definition (oodeval.results.result_row)."""
    from oodeval.results import BOOTSTRAPPED, COLUMNS, METRICS, SCORE_COLUMNS

    argv = ["score", "--train", str(folders / "train"), "--test", str(folders / "test"),
            "--ood", f"far={folders / 'far'}", "--ood", f"near={folders / 'near'}",
            "--detectors", "energy,knn,mahalanobis", "--set", "knn.k=5", "--draws", "40", "--seed", "3", "--no-progress"]  # fmt: skip
    assert main([*argv, "--out", str(tmp_path / "s.csv")]) == 0
    assert main([*argv, "--out", str(tmp_path / "s.parquet")]) == 0
    csv = pd.read_csv(tmp_path / "s.csv", comment="#").set_index(["detector", "ood"]).sort_index()
    grid = pd.read_parquet(tmp_path / "s.parquet").rename(columns={"dataset": "ood"}).set_index(["detector", "ood"]).sort_index()
    assert (grid["seed"] == 3).all() and list(csv.index) == list(grid.index) and len(csv) == 6
    cols = [*METRICS, *(f"{m}_{b}" for m in BOOTSTRAPPED for b in ("lo", "hi")), "n_id", "n_ood"]
    np.testing.assert_array_equal(csv[cols].to_numpy(float), grid[cols].to_numpy(float))
    # one meaning in both: the explicit overrides, and every hyperparameter the detector ran with
    assert list(csv["hyperparameters"]) == list(grid["hyperparameters"]) == ["{}", "{}", '{"k":5}', '{"k":5}', "{}", "{}"]
    assert list(csv["hyperparameters_resolved"]) == list(grid["hyperparameters_resolved"])
    assert set(csv.columns) <= set(SCORE_COLUMNS) and set(grid.columns) - {"ood"} <= set(COLUMNS)
