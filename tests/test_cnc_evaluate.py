"""The cnc detector, the per-set / mean / seed aggregation, the suites and the CLI."""

import json

import numpy as np
import pytest
from scipy.special import softmax

from oodeval.cnc.evaluate import aggregate, comparable, evaluate_run, format_cnc_table, id_view, set_metrics
from oodeval.cnc.suites import SUITES, ood_sets, suite
from oodeval.detectors import REGISTRY, create, names
from oodeval.features import FeatureSet
from oodeval.metrics import auroc, detection_error, tnr_at_tpr
from oodeval.report.labels import detector_label


def _fs(logits, labels=None, cnc=True):
    logits = np.asarray(logits, dtype=np.float32)
    k = logits.shape[1] - 1 if cnc else logits.shape[1]
    return FeatureSet(
        features=np.zeros((len(logits), 2), np.float32), labels=labels, logits=logits,
        meta={"num_id_classes": k, "outlier_class": k if cnc else None},
    )  # fmt: skip


def test_cnc_detector_score_is_one_minus_p_outlier():
    rng = np.random.default_rng(0)
    logits = (rng.normal(size=(50, 5)) * 3).astype(np.float32).astype(np.float64)  # as stored
    p_out = softmax(logits, axis=1)[:, -1]
    det = create("cnc", form="prob").fit()
    np.testing.assert_allclose(det.score(_fs(logits)), 1 - p_out, rtol=1e-12, atol=1e-15)
    lo = create("cnc").fit().score(_fs(logits))
    np.testing.assert_allclose(lo, np.log((1 - p_out) / p_out), rtol=1e-9, atol=1e-12)
    assert np.array_equal(np.argsort(lo, kind="stable"), np.argsort(1 - p_out, kind="stable"))
    # another outlier column
    p0 = softmax(logits, axis=1)[:, 0]
    np.testing.assert_allclose(create("cnc", form="prob", outlier_class=0).fit().score(_fs(logits)), 1 - p0)
    # higher = ID: a sample dominated by the outlier logit scores lowest
    logits[7, -1] = 50
    assert create("cnc").fit().score(_fs(logits)).argmin() == 7
    # log-odds keeps resolution where 1 - p saturates to 0
    sat = np.array([[0.0, 0.0, 60.0], [0.0, 0.0, 70.0]])
    lo2 = create("cnc").fit().score(_fs(sat))
    assert lo2[0] > lo2[1]


def test_cnc_detector_is_registered_but_not_one_of_the_21():
    create("cnc")
    assert "cnc" in REGISTRY and "cnc" in names() and "cnc" not in names("paper21")
    with pytest.raises(ValueError, match="form"):
        create("cnc", form="odds").fit().score(_fs(np.zeros((3, 3))))
    with pytest.raises(ValueError, match="outlier_class"):
        create("cnc", outlier_class=5).fit().score(_fs(np.zeros((3, 3))))
    plain = _fs(np.zeros((3, 3)), cnc=False)
    plain.meta["cnc"] = False
    with pytest.raises(ValueError, match="plain"):
        create("cnc").fit().score(plain)


def test_set_metrics_and_mean():
    rng = np.random.default_rng(1)
    idd = rng.normal(1, 1, 300)
    ood = {"a": rng.normal(0, 1, 200), "b": rng.normal(-1, 1, 100)}
    m = set_metrics(idd, ood)
    assert m["a"]["tnr95"] == pytest.approx(tnr_at_tpr(idd, ood["a"]))
    assert m["b"]["auroc"] == pytest.approx(auroc(idd, ood["b"]))
    assert m["b"]["detection_error"] == pytest.approx(detection_error(idd, ood["b"]))
    for k in ("tnr95", "auroc", "detection_error"):
        assert m["mean"][k] == pytest.approx((m["a"][k] + m["b"][k]) / 2)


def test_evaluate_run_uses_first_k_for_posthoc_and_accuracy():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(40, 4))
    labels = logits[:, :3].argmax(1)
    logits[:, 3] = logits.max(1) + 1  # the outlier column always wins: must not count as a prediction
    ood_logits = rng.normal(size=(30, 4))
    ood_logits[:, 3] += 3
    r = evaluate_run(_fs(logits, labels), {"x": _fs(ood_logits)}, ["cnc", "msp"], groups={"g": ["x"]})
    assert r["id_accuracy"] == 1.0
    msp_id = softmax(logits[:, :3], axis=1).max(1)
    msp_ood = softmax(ood_logits[:, :3], axis=1).max(1)
    assert r["detectors"]["msp"]["sets"]["x"]["auroc"] == pytest.approx(auroc(msp_id, msp_ood))
    assert r["detectors"]["msp"]["groups"]["g"] == r["detectors"]["msp"]["mean"]
    assert id_view(_fs(logits)).logits.shape == (40, 3)
    plain = _fs(logits[:, :3], labels, cnc=False)
    assert id_view(plain) is plain


def test_aggregate_mean_std_ddof1_and_table():
    runs = []
    for s in range(3):
        rng = np.random.default_rng(s)
        lg = rng.normal(size=(30, 3))
        runs.append(evaluate_run(_fs(lg, lg[:, :2].argmax(1) * (s != 1)), {"o": _fs(rng.normal(size=(20, 3)))}, ["cnc"]))
    agg = aggregate(runs)
    vals = [r["detectors"]["cnc"]["sets"]["o"]["auroc"] for r in runs]
    leaf = agg["detectors"]["cnc"]["sets"]["o"]["auroc"]
    assert leaf["mean"] == pytest.approx(np.mean(vals)) and leaf["std"] == pytest.approx(np.std(vals, ddof=1))
    assert leaf["ddof"] == 1 and leaf["n"] == 3
    text = format_cnc_table(agg)
    assert "TNR@TPR95" in text and "±" in text and "ddof=1" in text
    with pytest.raises(ValueError, match="ddof"):
        aggregate(runs[:1])


def test_suites():
    assert ood_sets("cnc-cifar10") == ("svhn:test", "tin-crop", "tin-resize", "lsun-crop", "lsun-resize", "isun")
    assert suite("cnc-cifar100").id_test == "cifar100:test"
    oo = suite("openood-cifar10")
    assert oo.groups["near"] == ("cifar100:test", "tin") and oo.groups["far"] == ("mnist", "svhn:test", "texture", "places365")
    assert suite("openood-cifar100").groups["near"][0] == "cifar10:test"
    from oodeval.data import REGISTRY as DATA

    for name in ("cnc-cifar10", "cnc-cifar100"):
        s = SUITES[name]
        for d in s.ood + (s.id_test,):
            assert d.split(":")[0] in DATA, d
    with pytest.raises(KeyError, match="known"):
        suite("cifar11")


def _striped_set() -> tuple[np.random.Generator, np.ndarray, np.ndarray]:
    """48 greyscale 12x12 images of 3 classes (a bright stripe at a class-dependent row) and the generator."""
    rng = np.random.default_rng(0)
    labels = np.arange(48) % 3
    images = rng.integers(0, 50, size=(48, 12, 12), dtype=np.uint8)
    for i, c in enumerate(labels):
        images[i, c * 4 : c * 4 + 3] = 220
    return rng, images, labels


def test_cli_train_and_evaluate(tmp_path, capsys):
    from oodeval.cli import main

    rng, images, labels = _striped_set()
    np.savez(tmp_path / "train.npz", images=images, labels=labels)
    np.savez(tmp_path / "ood.npz", images=rng.integers(0, 256, size=(20, 12, 12), dtype=np.uint8))
    ck = tmp_path / "ck"
    common = ["--model", "test_resnet", "--epochs", "1", "--batch-size", "16", "--no-progress"]
    assert main(["cnc", "train", "--dataset", str(tmp_path / "train.npz"), "--out", str(ck), *common,
                 "--corruptions", "contrast,pixelate"]) == 0  # fmt: skip
    assert json.loads((ck / "config.json").read_text())["num_classes"] == 3
    out = tmp_path / "res.json"
    assert main(["cnc", "evaluate", "--checkpoint", str(ck), "--id-test", str(tmp_path / "train.npz"),
                 "--ood", str(tmp_path / "ood.npz"), "--json", str(out), "--no-progress"]) == 0  # fmt: skip
    res = json.loads(out.read_text())
    assert set(res["runs"][0]["detectors"]) == {"cnc", "msp", "energy"}
    assert "TNR@TPR95" in capsys.readouterr().out
    assert main(["cnc", "evaluate", "--checkpoint", str(ck), "--no-progress"]) == 2
    assert "--suite" in capsys.readouterr().err


def test_cli_evaluate_refuses_incomparable_inputs(tmp_path, capsys):
    from oodeval.cli import main

    rng, images, labels = _striped_set()
    np.savez(tmp_path / "train.npz", images=images, labels=labels)
    np.savez(tmp_path / "other.npz", images=images[::-1], labels=labels[::-1])
    np.savez(tmp_path / "ten.npz", images=images, labels=np.arange(48) % 10)
    np.savez(tmp_path / "big.npz", images=rng.integers(0, 256, size=(20, 14, 14), dtype=np.uint8))
    np.savez(tmp_path / "rgb.npz", images=rng.integers(0, 256, size=(20, 12, 12, 3), dtype=np.uint8))
    common = ["--model", "test_resnet", "--epochs", "1", "--batch-size", "16", "--no-progress", "--corruptions", "contrast"]
    for name, data, seed in (("s0", "train", "0"), ("s1", "train", "1"), ("o1", "other", "1")):
        assert main(["cnc", "train", "--dataset", str(tmp_path / f"{data}.npz"), "--out", str(tmp_path / name),
                     "--seed", seed, *common]) == 0  # fmt: skip
    cfg = json.loads((tmp_path / "s0" / "config.json").read_text())
    assert cfg["image_size"] == [12, 12] and cfg["in_chans"] == 1 and cfg["num_classes"] == 3 and cfg["data_hash"]
    capsys.readouterr()

    def evaluate(*extra, ck=("s0",), id_test="train"):
        code = main(["cnc", "evaluate", "--checkpoint", *[str(tmp_path / c) for c in ck],
                     "--id-test", str(tmp_path / f"{id_test}.npz"), "--no-progress", *extra])  # fmt: skip
        return code, capsys.readouterr()

    code, out = evaluate("--ood", str(tmp_path / "big.npz"))
    assert code == 2 and "14x14" in out.err and "12x12" in out.err and "--resize" in out.err
    code, out = evaluate("--ood", str(tmp_path / "big.npz"), "--resize")
    assert code == 0 and "TNR@TPR95" in out.out
    code, out = evaluate("--ood", str(tmp_path / "rgb.npz"))
    # --channels converts decoded image files only: for an .npz the advice is to write it in 1 channel
    assert code == 2 and "3-channel" in out.err and "write the .npz with 1-channel images" in out.err
    assert "pass --channels" not in out.err
    code, out = evaluate("--ood", str(tmp_path / "big.npz"), "--resize", id_test="ten")
    assert code == 2 and "K = 3" in out.err
    code, out = evaluate("--ood", str(tmp_path / "big.npz"), "--resize", ck=("s0", "o1"))
    assert code == 2 and "data_hash" in out.err and "more than the seed" in out.err
    code, out = evaluate("--ood", str(tmp_path / "big.npz"), "--resize", ck=("s0", "s1"))
    assert code == 0 and "mean ± std over 2 runs" in out.out


def test_grid_treats_k_plus_one_models_like_cnc_evaluate(tmp_path):
    from oodeval.experiment import run_experiment
    from oodeval.results import load_results

    rng = np.random.default_rng(3)
    k, d = 3, 6
    W, b = rng.normal(size=(k + 1, d)).astype(np.float32), rng.normal(size=k + 1).astype(np.float32)

    def fs(n, labelled, shift):
        y = rng.integers(0, k, n) if labelled else None
        z = (rng.normal(size=(n, d)) + shift).astype(np.float32)
        meta = {"cnc": True, "num_id_classes": k, "outlier_class": k}
        return FeatureSet(features=z, labels=y, logits=z @ W.T + b, weight=W, bias=b, meta=meta)

    sets = {"id_train": fs(80, True, 0.0), "id_test": fs(60, True, 0.0), "far": fs(40, False, 1.5)}
    # the outlier logit is the largest for most ID test images: over all K+1 logits the accuracy would collapse
    sets["id_test"].logits[:, k] += 5
    paths = {n: str(s.save(tmp_path / n)) for n, s in sets.items()}
    cfg = {
        "seeds": [0], "bootstrap_draws": 50, "results": str(tmp_path / "out" / "results.parquet"),
        "datasets": {"id_train": "train", "id_test": "test", "ood": ["far"]},
        "models": [{"name": "cnc-model", "features": paths}], "detectors": ["msp", "energy", "cnc"],
    }  # fmt: skip
    df = load_results(run_experiment(cfg, progress=False).results).set_index("detector")
    ref = evaluate_run(sets["id_test"], {"far": sets["far"]}, ("msp", "energy", "cnc"), train=sets["id_train"])
    for det in ("msp", "energy", "cnc"):
        assert df.loc[det, "auroc"] == pytest.approx(ref["detectors"][det]["sets"]["far"]["auroc"], abs=1e-12)
        assert df.loc[det, "id_accuracy"] == pytest.approx(ref["id_accuracy"], abs=1e-12)
    first_k = (sets["id_test"].logits[:, :k].argmax(1) == sets["id_test"].labels).mean()
    assert ref["id_accuracy"] == pytest.approx(first_k) and first_k > 0.1


def test_cli_evaluate_results_table_shows_in_report(tmp_path, capsys):
    """`cnc evaluate --results R.parquet` writes results rows (same numbers as its JSON, with CIs)
    and `oodeval report R.parquet` shows them in its CnC summary."""
    from oodeval.cli import main
    from oodeval.results import load_results
    from oodeval.stats import mean_std

    rng, images, labels = _striped_set()
    np.savez(tmp_path / "train.npz", images=images, labels=labels)
    np.savez(tmp_path / "far.npz", images=rng.integers(0, 256, size=(20, 12, 12), dtype=np.uint8))
    np.savez(tmp_path / "near.npz", images=rng.integers(0, 120, size=(24, 12, 12), dtype=np.uint8))
    common = ["--model", "test_resnet", "--epochs", "1", "--batch-size", "16", "--no-progress", "--corruptions", "contrast"]
    for seed in ("0", "1"):
        assert main(["cnc", "train", "--dataset", str(tmp_path / "train.npz"), "--out", str(tmp_path / f"s{seed}"),
                     "--seed", seed, *common]) == 0  # fmt: skip
    results, js = tmp_path / "r.parquet", tmp_path / "r.json"
    assert main(["cnc", "evaluate", "--checkpoint", str(tmp_path / "s0"), str(tmp_path / "s1"), "--id-test",
                 str(tmp_path / "train.npz"), "--ood", str(tmp_path / "far.npz"), str(tmp_path / "near.npz"),
                 "--results", str(results), "--json", str(js), "--draws", "50", "--no-progress"]) == 0  # fmt: skip
    runs = json.loads(js.read_text())["runs"]
    df = load_results(results)
    assert len(df) == 2 * 3 * 2 and (df["status"] == "ok").all() and set(df["seed"]) == {0, 1}
    # what the report needs to average only like runs
    assert (df["epochs_done"] == 1).all() and df["finished"].all() and df["train_config"].nunique() == 1
    assert set(df["trained_on"]) == {"cpu fp32"} and set(df["scored_on"]) == {"cpu fp32"} and df["data_hash"].notna().all()
    for seed, run in enumerate(runs):
        for _, row in df[df["seed"] == seed].iterrows():
            ref = run["detectors"][row["detector"]]["sets"][row["dataset"]]
            assert row["tnr95"] == ref["tnr95"] and row["auroc"] == ref["auroc"]
            assert row["id_accuracy"] == run["id_accuracy"] and row["tnr95_lo"] <= row["tnr95"] <= row["tnr95_hi"]
    capsys.readouterr()
    assert main(["report", str(results), "--out", str(tmp_path / "rep"), "--draws", "10"]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    cnc_part = md[md.index("CnC-style summary"):]
    assert "test\\_resnet (CnC)" in cnc_part
    for det in ("cnc", "msp", "energy"):
        for ood in ("far", "near"):
            tnr = mean_std(np.array([r["detectors"][det]["sets"][str(tmp_path / f"{ood}.npz")]["tnr95"] for r in runs]), ddof=1)
            line = next(x for x in cnc_part.splitlines() if f"| {detector_label(det)} |" in x and f"{ood}.npz" in x)
            assert f"| 2 | {100 * tnr['mean']:.2f} ± {100 * tnr['std']:.2f} |" in line


def test_cli_evaluate_refuses_unfinished_checkpoints_unless_marked(tmp_path, capsys, monkeypatch):
    from oodeval.cli import main
    from oodeval.cnc.suites import Suite
    from oodeval.cnc.train import CnCTrainConfig, train

    rng, images, labels = _striped_set()
    np.savez(tmp_path / "train.npz", images=images, labels=labels)
    np.savez(tmp_path / "ood.npz", images=rng.integers(0, 256, size=(20, 12, 12), dtype=np.uint8))
    cfg = CnCTrainConfig(model="test_resnet", num_classes=3, in_chans=1, epochs=3, batch_size=16, corruptions=("contrast",))
    train(cfg, images, labels, tmp_path / "part", progress=False, stop_after=1)  # 1 of 3 epochs
    capsys.readouterr()
    base = ["cnc", "evaluate", "--id-test", str(tmp_path / "train.npz"), "--ood", str(tmp_path / "ood.npz"), "--no-progress"]
    assert main([*base, "--checkpoint", str(tmp_path / "part")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{tmp_path / 'part'} is unfinished: 1 of 3 epochs trained" in err
    js = tmp_path / "u.json"
    assert main([*base, "--checkpoint", str(tmp_path / "part"), "--allow-unfinished", "--json", str(js)]) == 0
    assert "UNFINISHED (1 of 3 epochs)" in capsys.readouterr().out
    res = json.loads(js.read_text())
    assert res["finished"] is False and res["epochs_done"] == 1 and res["scored_on"] == {"device": "cpu", "precision": "fp32"}
    # even when allowed, runs that reached different epochs are not averaged
    with pytest.raises(ValueError, match="b reached epoch 2 and a epoch 1"):
        comparable([cfg, cfg], ["a", "b"], [1, 2])
    # a suite with one group holding every set prints no group row that would only repeat the mean
    one = Suite("one", str(tmp_path / "train.npz"), str(tmp_path / "train.npz"), {"ood": (str(tmp_path / "ood.npz"),)}, "test")
    two = Suite("two", str(tmp_path / "train.npz"), str(tmp_path / "train.npz"),
                {"near": (str(tmp_path / "ood.npz"),), "far": (str(tmp_path / "train.npz"),)}, "test")  # fmt: skip
    monkeypatch.setitem(SUITES, "one", one)
    monkeypatch.setitem(SUITES, "two", two)
    for name, shown in (("one", False), ("two", True)):
        assert main(["cnc", "evaluate", "--checkpoint", str(tmp_path / "part"), "--allow-unfinished", "--suite", name,
                     "--detectors", "cnc", "--no-progress"]) == 0  # fmt: skip
        out = capsys.readouterr().out
        assert ("[ood]" in out, "[near]" in out) == (False, shown) and " mean " in out


def _cnc_rows(model, weights, seed, epochs, id_test, auroc):
    return [dict(model=model, weights=weights, detector="cnc", hyperparameters="{}", dataset=d, split="all", seed=seed,
                 tnr95=auroc - 0.1, auroc=auroc + (0.01 if d == "b" else 0), detection_error=0.2, id_accuracy=0.9,
                 kind="supervised", label="cnc", status="ok", id_test=id_test, id_train=None, train_config="cfg" + str(epochs),
                 data_hash="d1", epochs_done=epochs, finished=True, trained_on="cpu fp32", scored_on="cpu fp32")
            for d in ("a", "b")]  # fmt: skip


def test_report_cnc_summary_averages_only_like_runs(tmp_path):
    import pandas as pd

    from oodeval.report import build_views
    from oodeval.results import load_results, save_results
    from oodeval.stats import mean_std

    rows = (_cnc_rows("m (CnC)", "/r/s0", 0, 3, "cifar10:test", 0.90) + _cnc_rows("m (CnC)", "/r/s1", 1, 3, "cifar10:test", 0.80)
            + _cnc_rows("m (CnC)", "/r/e2", 0, 2, "cifar10:test", 0.50) + _cnc_rows("m (CnC)", "/r/c100", 0, 3, "cifar100:test", 0.30))  # fmt: skip
    path = tmp_path / "r.parquet"
    save_results(pd.DataFrame(rows), path)
    views, _ = build_views(load_results(path), path, primary="a")
    cnc = next(v for v in views if v.key == "cnc")
    assert "ddof=1" in cnc.caption
    frame = cnc.frame
    groups = list(dict.fromkeys(frame["Group"]))
    assert len(groups) == 3, groups
    g3 = next(g for g in groups if "3 epochs" in g and "cifar10:test" in g)
    assert "s0 (seed 0)" in g3 and "s1 (seed 1)" in g3 and "e2" not in g3 and "c100" not in g3
    assert any("2 epochs" in g and "e2 (seed 0)" in g for g in groups) and any("cifar100:test" in g for g in groups)
    a = frame[(frame["Group"] == g3) & (frame["OOD set"] == "a")].iloc[0]
    s = mean_std(np.array([0.90, 0.80]), ddof=1)
    assert a["runs"] == "2" and a["AUROC"] == f"{100 * s['mean']:.2f} ± {100 * s['std']:.2f}"
