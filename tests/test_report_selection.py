"""Reports never tune on the test sets: configurations are declared or shown side by side, labelled;
one tie rule for "best"; CIs, OpenOOD's convention, near/far groups and vector figures."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from test_report_html import make_sets

from oodeval import cli
from oodeval.experiment import load_config, run_experiment
from oodeval.metrics import fpr_ood_positive
from oodeval.report import build_views, write_report
from oodeval.report.selection import select_configurations
from oodeval.report.views import best_row, prepare
from oodeval.results import load_cell_scores, load_results


def _config(tmp, paths, k: int) -> dict:
    return {
        "name": f"knn{k}",
        "bootstrap_draws": 50,
        "results": str(tmp / "results.parquet"),
        "datasets": {"id_train": "t", "id_test": "v", "ood": [{"name": "small", "group": "near"}, {"name": "big", "group": "far"}]},
        "models": [{"name": "synthetic", "features": paths}],
        "detectors": ["msp", "energy", {"name": "knn", "hyperparameters": {"k": k}}],
    }


@pytest.fixture(scope="module")
def two_knn(tmp_path_factory):
    """The issue's case: a grid run with knn k=5, then the file changed to k=10 and rerun."""
    tmp = tmp_path_factory.mktemp("sel")
    paths = make_sets(tmp)
    run_experiment(_config(tmp, paths, 5), progress=False)
    summary = run_experiment(_config(tmp, paths, 10), progress=False)
    return tmp, summary.results, _config(tmp, paths, 10)


def _knn_fpr(results, k: int, dataset: str) -> float:
    df = load_results(results)
    return float(df[(df["detector"] == "knn") & (df["hyperparameters"] == f'{{"k":{k}}}') & (df["dataset"] == dataset)]["fpr95"].iloc[0])


def test_without_experiment_both_configurations_are_labelled_and_named(two_knn):
    tmp, results, _ = two_knn
    paths = write_report(results, tmp / "all", draws=20, formats=("png",))
    md = paths["markdown"].read_text()
    assert "k-NN on synthetic (k=5; k=10)" in md  # the rule states which detector has several configurations
    views, _ = build_views(load_results(results), results, primary="small", draws=20)
    a1 = next(v for v in views if v.key == "tabA1").frame
    assert {"knn k=5", "knn k=10"} <= {c.title for c in a1["Detector"]}  # both shown, each labelled
    assert {"k-NN k=5", "k-NN k=10"} <= {c.text for c in a1["Detector"]}
    assert "knn" not in {c.title for c in a1["Detector"]}
    t1 = next(v for v in views if v.key == "tab1").frame
    assert t1["FPR detector"].iloc[0].title != "knn"  # a knn pick is always named with its configuration


def test_declared_rule_shows_only_the_experiments_configuration(two_knn):
    tmp, results, cfg = two_knn
    sel = select_configurations(load_results(results), load_config(cfg))
    assert set(sel.rows[sel.rows["detector"] == "knn"]["hyperparameters"]) == {'{"k":10}'}
    assert "2 evaluated cell(s) of other configurations" in sel.statement  # k=5 on small and big
    paths = write_report(results, tmp / "declared", draws=20, experiment=cfg, formats=("png",))
    md = paths["markdown"].read_text()
    assert "declared by experiment 'knn10'" in md and "k=5" not in md
    frame = prepare(sel.rows)
    knn = frame[(frame["det"] == "knn") & (frame["dataset"] == "small")]
    # the declared k=10 row, even where k=5 would have been better on the test set
    assert knn["fpr95"].iloc[0] == _knn_fpr(results, 10, "small")


def test_cli_report_with_experiment_and_openood_convention(two_knn, capsys):
    tmp, results, cfg = two_knn
    exp = tmp / "exp.toml"
    exp.write_text(_toml(cfg))
    out = tmp / "cli"
    assert cli.main(["report", str(results), "--out", str(out), "--draws", "20", "--dataset", "small", "--experiment", str(exp), "--convention", "openood"]) == 0
    md = (out / "report.md").read_text()
    assert "FPR@95 OOD-pos" in md and "knn k=5" not in md
    rows = _openood_rows(results)
    views, _ = build_views(rows, results, primary="small", draws=20, convention="openood")
    t1 = next(v for v in views if v.key == "tab1").frame
    assert list(t1.columns).index("FPR@95 OOD-pos") < list(t1.columns).index("FPR@95")  # the chosen convention leads
    t1 = t1.iloc[0]
    row = rows[(rows["dataset"] == "small") & (rows["label"] == t1["FPR detector"].title)].iloc[0]
    assert t1["FPR@95 OOD-pos"].startswith(f"{100 * fpr_ood_positive(*load_cell_scores(row, results)):.1f} [")
    capsys.readouterr()


def _openood_rows(results):
    sel = select_configurations(load_results(results), None)
    return sel.rows[sel.rows["hyperparameters"] != '{"k":5}']


def _toml(cfg: dict) -> str:
    ood = ", ".join(f'{{ name = "{d["name"]}", group = "{d["group"]}" }}' for d in cfg["datasets"]["ood"])
    feats = ", ".join(f'{k} = "{v}"' for k, v in cfg["models"][0]["features"].items())
    return (
        f'name = "{cfg["name"]}"\nresults = "{cfg["results"]}"\nbootstrap_draws = 50\n'
        f'detectors = ["msp", "energy", {{ name = "knn", hyperparameters = {{ k = 10 }} }}]\n'
        f'[datasets]\nid_train = "t"\nid_test = "v"\nood = [{ood}]\n'
        f'[[models]]\nname = "synthetic"\nfeatures = {{ {feats} }}\n'
    )


def test_cis_in_every_cell_and_group_means(two_knn):
    tmp, results, cfg = two_knn
    paths = write_report(results, tmp / "groups", draws=20, experiment=cfg, primary="small")
    md = paths["markdown"].read_text()
    ci = re.compile(r"(\d+\.\d) \[(\d+\.\d), (\d+\.\d)\]")
    found = ci.findall(md)
    assert len(found) > 10
    for v, lo, hi in found:
        assert float(lo) <= float(v) <= float(hi)
    assert "Mean (far)" in md  # the far group's mean row in Tab. A2 (big is the only other set)
    for key in ("fig1", "roc", "hist", "figA4"):
        png = paths[key]
        assert png.with_suffix(".pdf").read_bytes()[:5] == b"%PDF-"
        assert b"<svg" in png.with_suffix(".svg").read_bytes()[:2000]
    assert "figures/fig1_best_per_dataset.pdf" in paths["latex"].read_text()


def test_one_tie_rule_for_best():
    rows = pd.DataFrame(
        [
            {"det": "energy", "fpr95": 0.5, "auroc": 0.80},
            {"det": "msp", "fpr95": 0.5, "auroc": 0.80},
            {"det": "knn", "fpr95": 0.5, "auroc": 0.90},
            {"det": "vim", "fpr95": 0.6, "auroc": 0.95},
        ]
    )
    assert best_row(rows)["det"] == "knn"  # equal FPR@95: the higher AUROC
    assert best_row(rows.iloc[:2])["det"] == "msp"  # equal both: the paper's order (msp before energy)
    assert best_row(rows.iloc[[1, 0]])["det"] == "msp" and best_row(rows.iloc[[0, 1]])["det"] == "msp"  # whatever the order
    assert best_row(rows, "auroc")["det"] == "vim"
    assert best_row(rows.iloc[:2], "auroc")["det"] == "msp"
    with pytest.raises(ValueError):
        best_row(rows.iloc[:0])


def test_fig_a4_band_is_clipped_and_histogram_axes_labelled():
    from oodeval.report import figures

    curves = {"x": {"n": np.array([10, 100]), "mean": np.array([0.02, 0.5]), "std": np.array([0.05, 0.3]), "full": 0.03, "detector": "msp"}}
    ax = figures.subsampling_bands(curves, "m", None, None).axes[0]
    y = np.concatenate([p.vertices[:, 1] for p in ax.collections[0].get_paths()])
    assert y.min() == 0 and y.max() == 100  # 2 - 10 and 50 + 60 clipped
    assert ax.get_ylim() == (-4, 104)  # a margin, so a series at 0 or 100 is not hidden by the frame
    rng = np.random.default_rng(0)
    ax = figures.histograms({"m": ("msp", rng.normal(size=50), rng.normal(size=30))}, "ood").axes[0]
    assert ax.get_xlabel() and ax.get_ylabel() == "density"


def test_opt_in_search_on_validation_data_only(tmp_path):
    from oodeval import detectors
    from oodeval.features import FeatureSet
    from oodeval.metrics import auroc, fpr_at_tpr

    paths = make_sets(tmp_path)
    train = FeatureSet.load(paths["id_train"])
    rng = np.random.default_rng(11)
    z_id = train.features[:60] + rng.normal(scale=0.3, size=train.features[:60].shape).astype(np.float32)
    z_ood = (rng.normal(size=(50, train.features.shape[1])) * 2.0).astype(np.float32)
    for name, z, y in (("val_id", z_id, train.labels[:60]), ("val_ood", z_ood, np.full(50, -1))):
        fs = FeatureSet(features=z, labels=y, logits=z @ train.weight.T + train.bias, weight=train.weight, bias=train.bias)
        paths[name.replace("val", "validation")] = str(fs.save(tmp_path / "feats" / name))
    grid = [1, 3, 40]
    cfg = {
        "bootstrap_draws": 20,
        "results": str(tmp_path / "results.parquet"),
        "selection": {"validation_id": "val_id", "validation_ood": "val_ood"},
        "datasets": {"id_train": "t", "id_test": "v", "ood": ["small", "big"]},
        "models": [{"name": "synthetic", "features": paths}],
        "detectors": ["msp", {"name": "knn", "search": {"k": grid}}],
    }
    from oodeval.experiment.check import check_experiment

    assert not [p for p in check_experiment(load_config(cfg)) if "validation" in p]  # run --check sees the validation sets
    missing = {**cfg, "models": [{"name": "synthetic", "features": {k: v for k, v in paths.items() if k != "validation_ood"}}]}
    assert any("validation_ood" in p and "val_ood" in p for p in check_experiment(load_config(missing, base_dir=tmp_path)))
    summary = run_experiment(cfg, progress=False)
    assert summary.failed == 0
    df = load_results(summary.results)
    knn = df[df["detector"] == "knn"]
    assert set(knn["hyperparameters"]) == {'{"search":{"k":[1,3,40]}}'} and len(knn) == 2
    # the choice, recomputed by hand on the validation sets (lowest FPR@95, ties: higher AUROC, then grid order)
    val_id, val_ood = FeatureSet.load(paths["validation_id"]), FeatureSet.load(paths["validation_ood"])
    keys = []
    for k in grid:
        det = detectors.create("knn", k=k).fit(train)
        s_id, s_ood = det.score(val_id), det.score(val_ood)
        keys.append((fpr_at_tpr(s_id, s_ood), -auroc(s_id, s_ood)))
    chosen = grid[keys.index(min(keys))]
    assert all(s.startswith(f"validation: k={chosen} chosen from k in [1, 3, 40]") for s in knn["selection"])
    assert df[df["detector"] == "msp"]["selection"].isna().all()
    # the test-set scores are those of the chosen k
    test = FeatureSet.load(paths["id_test"])
    id_scores, _ = load_cell_scores(knn.iloc[0], summary.results)
    np.testing.assert_array_equal(id_scores, detectors.create("knn", k=chosen).fit(train).score(test))
    md = write_report(summary.results, tmp_path / "rep", draws=10, experiment=cfg, formats=("png",))["markdown"].read_text()
    assert f"Chosen on validation data, never on a test set: k-NN on synthetic: validation: k={chosen}" in md
    assert run_experiment(cfg, progress=False).computed == 0  # the search's cells are found again on a rerun


@pytest.mark.parametrize(
    "change, message",
    [
        ({"selection": {"validation_id": "v", "validation_ood": "x"}}, "validation_id 'v' is the test ID set"),
        ({"selection": {"validation_id": "w", "validation_ood": "big"}}, "validation_ood 'big' is one of the test OOD sets"),
        ({"selection": None}, "declare a search but there is no \\[selection\\]"),
        ({"detectors": [{"name": "knn", "search": {"q": [1]}}]}, "'knn' has no hyperparameter\\(s\\) q"),
        ({"detectors": [{"name": "knn", "search": {"k": []}}]}, "search values must be non-empty lists"),
        ({"detectors": [{"name": "knn", "hyperparameters": {"k": 3}, "search": {"k": [1]}}]}, "k set both in hyperparameters and in search"),
    ],
)
def test_search_config_errors(change, message):
    cfg = {
        "selection": {"validation_id": "w", "validation_ood": "x"},
        "datasets": {"id_train": "t", "id_test": "v", "ood": ["small", "big"]},
        "models": [{"name": "synthetic", "pretrained": False}],
        "detectors": [{"name": "knn", "search": {"k": [1, 2]}}],
        **change,
    }
    if cfg["selection"] is None:
        del cfg["selection"]
    with pytest.raises(ValueError, match=message):
        load_config(cfg)
