"""The experiment grid on synthetic FeatureSets: cells, metrics, CIs, splits, reruns, failures."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.special import softmax

from oodeval import cli, evaluation
from oodeval.experiment import run_experiment, runner
from oodeval.features import FeatureSet
from oodeval.metrics import all_metrics, augrc, aurc
from oodeval.results import KEY, load_cell_scores, load_results

C, D = 4, 8


def make_sets(root, seed: int = 0) -> dict[str, str]:
    """ID train/test with class clusters, two OOD sets (one with a fine_grained extra)."""
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(C, D)).astype(np.float32)
    b = rng.normal(size=C).astype(np.float32)
    mu = rng.normal(size=(C, D)) * 2.5

    def id_set(n: int) -> FeatureSet:
        y = rng.integers(0, C, n)
        z = (mu[y] + rng.normal(size=(n, D))).astype(np.float32)
        return FeatureSet(features=z, labels=y, logits=z @ W.T + b, weight=W, bias=b)

    def ood_set(n: int, scale: float, extras: dict | None = None) -> FeatureSet:
        z = (rng.normal(size=(n, D)) * scale).astype(np.float32)
        return FeatureSet(features=z, logits=z @ W.T + b, weight=W, bias=b, extras=extras or {})

    paths = {}
    fine = np.arange(50) % 3 == 0
    for name, fs in {
        "id_train": id_set(160),
        "id_test": id_set(90),
        "near": ood_set(70, 2.0),
        "far": ood_set(50, 4.0, {"fine_grained": fine}),
    }.items():
        paths[name] = str(fs.save(root / "feats" / name))
    return paths


def config(tmp_path, paths, **top) -> dict:
    cfg = {
        "seeds": [0, 1],
        "bootstrap_draws": 200,
        "results": str(tmp_path / "out" / "results.parquet"),
        "datasets": {"id_train": "train", "id_test": "test", "ood": ["near", {"name": "far", "split_column": "fine_grained"}]},
        "models": [{"name": "synthetic", "features": paths}],
        "detectors": ["msp", {"name": "energy", "hyperparameters": {"temperature": 2.0}}, "mahalanobis", {"name": "knn", "hyperparameters": {"k": 10_000}}],
    }
    cfg.update(top)
    return cfg


@pytest.fixture
def grid(tmp_path):
    paths = make_sets(tmp_path)
    cfg = config(tmp_path, paths)
    summary = run_experiment(cfg, progress=False)
    return tmp_path, paths, cfg, summary


def test_grid_cells_metrics_and_failures(grid):
    tmp_path, paths, cfg, summary = grid
    df = load_results(summary.results)
    # 4 detectors x (near + far + 2 far splits) x 2 seeds
    assert summary.total == 4 * 4 * 2 == len(df)
    assert not df.duplicated(list(KEY)).any()
    ok, bad = df[df["status"] == "ok"], df[df["status"] == "error"]
    assert set(bad["detector"]) == {"knn"} and len(bad) == 8
    assert bad["error"].str.contains("k=10000").all() and bad["fpr95"].isna().all()
    assert summary.failed == 8 and summary.computed == 32
    # msp recomputed independently from the stored logits
    test, far = FeatureSet.load(paths["id_test"]), FeatureSet.load(paths["far"])
    id_msp = softmax(np.asarray(test.logits, np.float64), axis=1).max(axis=1)
    far_msp = softmax(np.asarray(far.logits, np.float64), axis=1).max(axis=1)
    fine = np.asarray(far.extras["fine_grained"])
    for split, mask in [("all", slice(None)), ("fine_grained=True", fine), ("fine_grained=False", ~fine)]:
        row = ok[(ok["detector"] == "msp") & (ok["dataset"] == "far") & (ok["split"] == split) & (ok["seed"] == 0)].iloc[0]
        ref = all_metrics(id_msp, far_msp[mask])
        for m, v in ref.items():
            # AUTC reads the score values, not only their order: the detector's float32 softmax
            # rounds each score by ~6e-8 relative, so AUTC (a mean of scores over their range) agrees to ~1e-6
            assert row[m] == pytest.approx(v, abs=1e-6 if m == "autc" else 1e-12)
        assert row["n_ood"] == far_msp[mask].size and row["n_id"] == 90
        np.testing.assert_allclose(load_cell_scores(row, summary.results)[1], far_msp[mask], rtol=1e-6)
    acc = float((np.asarray(test.logits).argmax(1) == test.labels).mean())
    assert np.allclose(ok["id_accuracy"], acc)
    # AURC / AUGRC: msp's ID scores as the classifier's confidence, the same in every OOD cell (rank-based: exact)
    correct = np.asarray(test.logits).argmax(1) == test.labels
    msp = ok[ok["detector"] == "msp"]
    assert np.allclose(msp["aurc"], aurc(id_msp, correct), rtol=0, atol=1e-12)
    assert np.allclose(msp["augrc"], augrc(id_msp, correct), rtol=0, atol=1e-12)
    assert (msp["aurc_lo"] <= msp["aurc"]).all() and (msp["aurc"] <= msp["aurc_hi"]).all()
    # CIs bracket the point estimate
    for m in ("fpr95", "auroc", "detection_error", "tnr95"):
        assert (ok[f"{m}_lo"] <= ok[m] + 1e-12).all() and (ok[m] <= ok[f"{m}_hi"] + 1e-12).all()
    assert (ok["hyperparameters"][ok["detector"] == "energy"] == '{"temperature":2.0}').all()
    # each configured detector fitted once per model (knn's fit fails, so it is not counted)
    assert summary.fits == 3


def test_rerun_computes_nothing_new(grid):
    tmp_path, paths, cfg, summary = grid
    cfg["retry_failed"] = False
    before = summary.results.read_bytes()
    calls = []

    def features(*args):
        calls.append(args)
        return runner.extract_experiment_features(*args)

    again = run_experiment(cfg, progress=False, features=features)
    assert again.computed == 0 and again.fits == 0 and again.skipped == again.total == summary.total
    assert summary.results.read_bytes() == before
    assert calls == []  # a settled run does not even look at its features


def test_rerun_retries_failures_and_adds_only_new_cells(grid):
    tmp_path, paths, cfg, summary = grid
    cfg["detectors"] = cfg["detectors"][:3] + [{"name": "knn", "hyperparameters": {"k": 5}}, "maxlogit"]
    again = run_experiment(cfg, progress=False)
    assert again.computed == 16 and again.fits == 2 and again.failed == 0
    df = load_results(summary.results)
    assert len(df) == 48  # the old failed knn k=10000 rows stay, keyed by their hyperparameters
    # failed cells of the same configuration are retried by default
    cfg["detectors"] = [{"name": "knn", "hyperparameters": {"k": 10_000}}]
    third = run_experiment(cfg, progress=False)
    assert third.computed == 8 and third.failed == 8


def test_interrupted_run_loses_only_the_cell_in_flight(tmp_path, monkeypatch):
    paths = make_sets(tmp_path)
    cfg = config(tmp_path, paths, detectors=["msp", "energy"])
    real = evaluation.cell_metrics
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 6:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluation, "cell_metrics", flaky)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, progress=False)
    df = load_results(cfg["results"])
    assert len(df) == 5 and (df["status"] == "ok").all()
    monkeypatch.setattr(evaluation, "cell_metrics", real)
    resumed = run_experiment(cfg, progress=False)
    assert resumed.skipped == 5 and resumed.computed == resumed.total - 5 == 11


def test_same_seed_same_bytes(tmp_path):
    paths = make_sets(tmp_path)
    a = run_experiment(config(tmp_path / "a", paths, detectors=["msp"]), progress=False)
    b = run_experiment(config(tmp_path / "b", paths, detectors=["msp"]), progress=False)
    cols = ["fpr95_lo", "fpr95_hi", "auroc_lo", "auroc_hi"]
    da, db = load_results(a.results), load_results(b.results)
    pd.testing.assert_frame_equal(da[cols], db[cols])
    s0, s1 = da[da["seed"] == 0][cols].to_numpy(), da[da["seed"] == 1][cols].to_numpy()
    assert not np.array_equal(s0, s1)  # the seed drives the bootstrap


def test_default_detectors_are_the_supported_ones_and_per_seed_weights(tmp_path):
    paths = make_sets(tmp_path)
    other = make_sets(tmp_path / "run1", seed=5)
    cfg = config(tmp_path, paths, detectors=None)
    del cfg["detectors"]
    cfg["datasets"]["ood"] = ["near"]
    cfg["models"] = [{"name": "synthetic", "weights": ["w0.pt", "w1.pt"]}]

    def features(model, weights, ds, role, c):
        src = paths if weights.endswith("w0.pt") else other
        return FeatureSet.load(src[role if role in src else ds.label])

    summary = run_experiment(cfg, progress=False, features=features)
    df = load_results(summary.results)
    from oodeval import detectors

    expected = set(detectors.supported(FeatureSet.load(paths["id_train"]), FeatureSet.load(paths["id_test"])))
    assert set(df["detector"]) == expected and "nac" not in expected
    assert df.groupby("seed")["weights"].nunique().eq(1).all() and df["weights"].nunique() == 2
    msp = df[df["detector"] == "msp"].set_index("seed")["auroc"]
    assert msp[0] != msp[1]  # each seed's run used its own weights' features


def test_cli_run_and_bad_file(tmp_path, capsys):
    paths = make_sets(tmp_path)
    feats = ", ".join(f'{k} = "{v}"' for k, v in paths.items())
    exp = tmp_path / "exp.toml"
    exp.write_text(
        f"""
seeds = [0]
bootstrap_draws = 50
[datasets]
id_train = "train"
id_test = "test"
ood = ["near", "far"]
[[models]]
name = "synthetic"
features = {{ {feats} }}
[[detectors]]
name = "msp"
"""
    )
    assert cli.main(["run", str(exp), "--no-progress"]) == 0
    assert "2 cells: 0 already done, 2 computed" in capsys.readouterr().out
    assert cli.main(["run", str(exp), "--no-progress"]) == 0
    assert "2 cells: 2 already done, 0 computed" in capsys.readouterr().out
    exp.write_text(exp.read_text().replace("seeds = [0]", "seeds = [0]\ncolour = 1"))
    assert cli.main(["run", str(exp)]) == 2
    assert "unknown key(s) 'colour'" in capsys.readouterr().err


def test_seed_detectors_refits_a_seeded_detector_per_seed(tmp_path):
    paths = make_sets(tmp_path)
    knn = {"name": "knn", "hyperparameters": {"k": 3, "bank_fraction": 0.3}}
    plain = run_experiment(config(tmp_path / "a", paths, detectors=[knn]), progress=False)
    seeded = run_experiment(config(tmp_path / "b", paths, detectors=[knn], seed_detectors=True), progress=False)
    assert plain.fits == 1 and seeded.fits == 2
    auc = load_results(seeded.results).query("dataset == 'near'").set_index("seed")["auroc"]
    assert auc[0] != auc[1]
    auc = load_results(plain.results).query("dataset == 'near'").set_index("seed")["auroc"]
    assert auc[0] == auc[1]


def test_results_table_reads_in_duckdb(grid):
    import duckdb
    summary = grid[3]
    df = load_results(summary.results)
    con = duckdb.connect()
    n, n_ok, best = con.execute(
        "SELECT count(*), count(*) FILTER (WHERE status = 'ok'), min(fpr95) FROM read_parquet(?)",
        [str(summary.results)],
    ).fetchone()
    assert n == len(df) and n_ok == int((df["status"] == "ok").sum())
    assert best == pytest.approx(df["fpr95"].min())
    keys = con.execute(f"SELECT {', '.join(KEY)} FROM read_parquet(?)", [str(summary.results)]).df()
    assert not keys.duplicated().any()


def test_bootstrap_mode_is_configurable_and_recorded(tmp_path):
    paths = make_sets(tmp_path)
    widths = {}
    for fixed in (True, False):
        cfg = config(tmp_path, paths, seeds=[0], bootstrap_fixed_id=fixed, detectors=["msp", "energy"])
        cfg["results"] = str(tmp_path / f"out{fixed}" / "results.parquet")
        df = load_results(run_experiment(cfg, progress=False).results)
        assert (df["bootstrap_fixed_id"] == fixed).all()
        for m in ("fpr95", "auroc"):
            assert (df[f"{m}_lo"] <= df[m] + 1e-12).all() and (df[m] <= df[f"{m}_hi"] + 1e-12).all()
        widths[fixed] = float((df["auroc_hi"] - df["auroc_lo"]).mean())
    # resampling the ID set as well can only add variance to the AUROC estimate
    assert widths[False] > widths[True]
    bad = config(tmp_path, paths, bootstrap_fixed_id="yes")
    with pytest.raises(ValueError, match="bootstrap_fixed_id"):
        run_experiment(bad, progress=False)


def _exp_with_weights(tmp_path, weights: str) -> "Path":
    from test_grid_e2e import make_data

    make_data(tmp_path / "data")
    exp = tmp_path / "exp.toml"
    exp.write_text(
        f"""
seeds = [0]
bootstrap_draws = 20
device = "cpu"
[datasets]
id_train = "data/train"
id_test = "data/val"
ood = ["data/gray", "data/fi"]
[[models]]
name = "timm:test_resnet"
weights = "{weights}"
model_kwargs = {{ num_classes = 3 }}
[[detectors]]
name = "msp"
[[detectors]]
name = "energy"
"""
    )
    return exp


def test_run_with_a_missing_weights_file_exits_non_zero_with_one_summary(tmp_path, capsys):
    exp = _exp_with_weights(tmp_path, "ckpt/missing.safetensors")
    assert cli.main(["run", str(exp), "--no-progress"]) == 1
    out, err = capsys.readouterr()
    assert "4 cells: 0 already done, 4 computed (4 failed)" in out
    # the one distinct error is printed once, with its count and a cell it hit
    assert out.count("missing.safetensors does not exist") == 1 and "  4 failed, e.g. timm:test_resnet/msp/gray/all/seed 0" in out
    assert f"4 of 4 cell(s) failed" in err and str(tmp_path / "results.parquet") in err and "status == 'error'" in err
    # kept failures (retry_failed = false) still make the exit status non-zero
    exp.write_text(exp.read_text().replace("seeds = [0]", "seeds = [0]\nretry_failed = false"))
    assert cli.main(["run", str(exp), "--no-progress"]) == 1
    out, _ = capsys.readouterr()
    assert "4 already done, 0 computed" in out and "4 cell(s) failed in an earlier run and were kept" in out


def test_check_validates_weights_model_names_and_datasets_offline(tmp_path, capsys):
    import torch
    from safetensors.torch import save_file

    from oodeval.features.backbones import load_backbone

    exp = _exp_with_weights(tmp_path, "ckpt/w.safetensors")
    (tmp_path / "ckpt").mkdir()
    assert cli.main(["run", str(exp), "--check"]) == 2
    assert "weights file " + str(tmp_path / "ckpt" / "w.safetensors") + " does not exist" in capsys.readouterr().err
    (tmp_path / "ckpt" / "w.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header")
    assert cli.main(["run", str(exp), "--check"]) == 2
    assert "w.safetensors is not a readable safetensors file" in capsys.readouterr().err
    sd = load_backbone("timm:test_resnet", model_kwargs={"num_classes": 3}).model.state_dict()
    save_file({k: v.contiguous() for k, v in sd.items() if isinstance(v, torch.Tensor)}, str(tmp_path / "ckpt" / "w.safetensors"))
    assert cli.main(["run", str(exp), "--check"]) == 0
    assert "check passed" in capsys.readouterr().out
    bad = exp.read_text().replace("timm:test_resnet", "timm:no_such_net").replace('"data/fi"', '"data/nothing-here"')
    exp.write_text(bad)
    assert cli.main(["run", str(exp), "--check"]) == 2
    err = capsys.readouterr().err
    assert "2 problem(s)" in err and "timm has no model 'no_such_net'" in err and "dataset 'nothing-here': " + str(tmp_path / "data" / "nothing-here") + " does not exist" in err


def test_shipped_example_check_says_exactly_what_it_needs(capsys):
    from pathlib import Path

    example = Path(__file__).parents[1] / "examples" / "experiment.toml"
    assert cli.main(["run", str(example), "--check"]) == 2
    err = capsys.readouterr().err
    for needed in ("resnet50_a1_in1k.safetensors does not exist", "convnext_base.safetensors does not exist",
                   "clip_b16.bin does not exist", "dataset 'imagenet1k-val'", "dataset 'ninco'",
                   "vocab/wordnet.json does not exist", "vocab/wordnet_ranked.json does not exist", "data/imagenet-train does not exist"):  # fmt: skip
        assert needed in err, needed
    assert "id_classes" not in err  # 'imagenet1k' names the built-in list, not a file
