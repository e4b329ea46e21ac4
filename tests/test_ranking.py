"""Rank statistics over a results table (oodeval.ranking, ``oodeval rank``): equal to scipy's and
scikit-posthocs' output on the same matrix, blocks built as documented, Demšar's published CD."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import scikit_posthocs as sp
from scipy.stats import friedmanchisquare

from oodeval.cli import main
from oodeval.errors import InputError
from oodeval.ranking import cd_diagram, rank_detectors, rank_matrix
from oodeval.results import empty_results, save_results

DETECTORS = ("msp", "energy", "knn", "vim")
MODELS = tuple(f"m{i}" for i in range(7))
SETS = ("near", "far")


def _table() -> tuple[pd.DataFrame, pd.DataFrame]:
    """A results table (two seeds, a split row and a failed row that must be left out) and the
    models x detectors matrix of fpr95 it should give: the mean over seeds and OOD sets."""
    rng = np.random.default_rng(5)
    base = {"msp": 0.5, "energy": 0.4, "knn": 0.3, "vim": 0.42}
    rows, expect = [], {}
    for m in MODELS:
        for d in DETECTORS:
            vals = []
            for s in SETS:
                for seed in (0, 1):
                    v = base[d] + rng.normal(0, 0.05)
                    vals.append(v)
                    rows.append(dict(model=m, weights="w", detector=d, hyperparameters="{}", dataset=s, split="all", seed=seed,
                                     status="ok", fpr95=v, auroc=1 - v))  # fmt: skip
                rows.append(dict(model=m, weights="w", detector=d, hyperparameters="{}", dataset=s, split="fine", seed=0,
                                 status="ok", fpr95=0.99, auroc=0.01))  # fmt: skip
            expect[(m, d)] = np.mean(vals)
    rows.append(dict(model="m0", weights="w", detector="knn", hyperparameters='{"k":1}', dataset="near", split="all", seed=0,
                     status="error", error="boom"))  # fmt: skip
    matrix = pd.DataFrame([[expect[(m, d)] for d in DETECTORS] for m in MODELS], index=list(MODELS), columns=list(DETECTORS))
    return pd.concat([empty_results(), pd.DataFrame(rows)], ignore_index=True), matrix


def test_matrix_is_the_mean_over_seeds_and_sets_of_ok_whole_set_rows():
    df, want = _table()
    got, dropped = rank_matrix(df, "fpr95", "backbone")
    assert dropped == []
    # means of 4 values in float64: order of summation differs at most in the last bits
    np.testing.assert_allclose(got.loc[want.index, list(DETECTORS)].to_numpy(float), want.to_numpy(), rtol=0, atol=1e-12)
    blocks, _ = rank_matrix(df, "fpr95", "backbone-ood")
    assert blocks.shape == (len(MODELS) * len(SETS), len(DETECTORS)) and "m3 / far" in blocks.index


@pytest.mark.parametrize("test", ["nemenyi", "conover", "wilcoxon"])
def test_equal_to_scipy_and_scikit_posthocs(test):
    df, m = _table()
    r = rank_detectors(df, "fpr95", "backbone", test)
    m = m[list(r.matrix.columns)]
    stat, p = friedmanchisquare(*m.to_numpy().T)
    assert (r.statistic, r.pvalue) == (pytest.approx(stat, rel=1e-12), pytest.approx(p, rel=1e-9))
    if test == "nemenyi":
        lib = sp.posthoc_nemenyi_friedman(m)
    elif test == "conover":
        lib = sp.posthoc_conover_friedman(m, p_adjust="holm")
    else:
        lib = sp.posthoc_wilcoxon(pd.melt(m, var_name="det", value_name="v"), val_col="v", group_col="det", p_adjust="holm")
    lib = lib.loc[r.pvalues.index, r.pvalues.columns]
    np.testing.assert_allclose(r.pvalues.to_numpy(), lib.to_numpy(dtype=float), rtol=1e-9, atol=1e-12)
    # average ranks: lower fpr95 is better, so rank 1 goes to the lowest value in each block
    want = pd.DataFrame(m).rank(axis=1).mean()
    np.testing.assert_allclose(r.ranks.to_numpy(), want[r.ranks.index].to_numpy(), rtol=0, atol=1e-12)
    assert r.ranks.index[0] == "knn" and list(r.ranks) == sorted(r.ranks)
    assert r.same_as_best[0] == "knn"
    assert all(d == "knn" or r.pvalues.loc["knn", d] >= 0.05 for d in r.same_as_best)


def test_higher_is_better_metric_reverses_the_ranks():
    df, _ = _table()
    low, high = rank_detectors(df, "fpr95"), rank_detectors(df, "auroc")  # auroc = 1 - fpr95 here
    np.testing.assert_allclose(low.ranks.to_numpy(), high.ranks[low.ranks.index].to_numpy(), atol=1e-12)


def test_nemenyi_cd_equals_demsar_table():
    df, _ = _table()
    r = rank_detectors(df, "fpr95", "backbone", "nemenyi")
    # Demšar (2006) Table 5(a): q_0.05 = 2.569 for k = 4 (three decimals: CD agrees to 5e-4 * sqrt(...))
    scale = np.sqrt(4 * 5 / (6 * len(MODELS)))
    assert r.cd == pytest.approx(2.569 * scale, abs=5e-4 * scale)
    assert rank_detectors(df, "fpr95", test="wilcoxon").cd is None


def test_bad_requests():
    df, _ = _table()
    with pytest.raises(InputError, match="at least 3 detectors"):
        rank_detectors(df, "fpr95", detectors=["msp", "knn"])
    with pytest.raises(InputError, match="not a column"):
        rank_detectors(df, "nope")
    with pytest.raises(InputError, match="backbone-ood"):
        rank_detectors(df[df["model"] == "m0"], "fpr95", "backbone")
    # a model x OOD set missing a detector is dropped and named; the model keeps its other set
    m, dropped = rank_matrix(df[~((df["model"] == "m2") & (df["detector"] == "vim") & (df["dataset"] == "far"))], "fpr95")
    assert dropped == ["m2 / far"] and "m2" in m.index
    near = df[(df["model"] == "m2") & (df["dataset"] == "near") & (df["split"] == "all")].groupby("detector")["fpr95"].mean()
    np.testing.assert_allclose(m.loc["m2", list(DETECTORS)].to_numpy(float), near[list(DETECTORS)].to_numpy(), atol=1e-12)


def test_cli_prints_the_library_numbers(tmp_path, capsys):
    df, m = _table()
    path = save_results(df, tmp_path / "r.parquet")
    assert main(["rank", str(path), "--metric", "fpr95", "--by", "backbone", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    stat, p = friedmanchisquare(*m.to_numpy().T)
    lib = sp.posthoc_nemenyi_friedman(m)
    assert [r["detector"] for r in rows][0] == "knn"
    for r in rows:
        assert r["friedman_statistic"] == pytest.approx(stat, rel=1e-12) and r["friedman_pvalue"] == pytest.approx(p, rel=1e-9)
        for o in DETECTORS:
            assert r[f"p_{o}"] == pytest.approx(float(lib.loc[r["detector"], o]), rel=1e-9, abs=1e-12)
    assert main(["rank", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"Friedman chi2 = {stat:.3f}" in out and "average rank" in out and "pairwise p-values" in out
    assert main(["rank", str(path), "--metric", "nope"]) == 2
    capsys.readouterr()


def test_cd_diagram_names_every_detector():
    pytest.importorskip("matplotlib")
    df, _ = _table()
    r = rank_detectors(df, "fpr95")
    fig = cd_diagram(r)
    texts = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert all(d in texts for d in DETECTORS)


def test_report_rank_view_marks_the_best_group():
    from oodeval.report.ranks import ranks_view

    df, _ = _table()
    df["vocabulary"] = pd.NA
    view = ranks_view(df, "paper")
    r = rank_detectors(df, "fpr95", "backbone", "nemenyi")  # 7 models >= 5: one block per model
    assert view.present and "N = 7 blocks (backbone: model)" in view.caption and "Friedman" in view.caption
    assert [c.title for c in view.frame["Detector"]] == list(r.ranks.index)
    assert [c.title for c in view.frame["Detector"] if c.bold] == r.same_as_best
    # the openood convention ranks its own FPR@95, absent here: the view says why it is omitted
    assert not ranks_view(df, "openood").present and "fpr95_ood_positive" in ranks_view(df, "openood").note


def test_report_metrics_view_leads_with_the_conventions_aupr():
    from oodeval.report.ranks import peer_metrics
    from oodeval.report.views import prepare

    df, _ = _table()
    df["vocabulary"] = pd.NA
    df["kind"] = "supervised"
    df["aupr_in"], df["aupr_in_trapezoid"], df["autc"] = 0.9, 0.8, 0.3
    frame = prepare(df)
    paper, openood = peer_metrics(frame, "paper"), peer_metrics(frame, "openood")
    cols = [c for c in paper.frame.columns if c.startswith("AUPR")]
    assert cols[0] == "AUPR-In AP" and [c for c in openood.frame.columns if c.startswith("AUPR")][0] == "AUPR-In trapz"
    assert set(paper.frame["AUPR-In trapz"]) == {"80.0"} and set(paper.frame["AUTC"]) == {"30.0"}
