"""One registry for detectors and zero-shot scorers: tags, order, creation, and every detector in `score`."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from oodeval import detectors, zeroshot
from oodeval.cli import main
from oodeval.detectors._synthetic import synthetic_problem
from oodeval.features import FeatureSet
from oodeval.metrics import auroc
from oodeval.registry import Registry

PAPER21 = [
    "msp", "maxlogit", "kl_matching", "energy", "gen", "react", "ash_s", "scale", "dice",
    "mahalanobis", "relative_mahalanobis", "mahalanobis_pp", "relative_mahalanobis_pp",
    "knn", "cosine", "mcm", "fdbd", "neco", "nac", "vim", "nnguide",
]  # fmt: skip
#: the methods that need the network (detectors.network), in its source order
NETWORK = ["odin", "mahalanobis_ensemble", "gram", "rankfeat", "mc_dropout", "deep_ensemble", "adascale_a", "adascale_l", "iodin"]
#: the peers' methods (OpenOOD v1.5, pytorch-ood 0.4) oodeval adds
PEERS = [
    "ash_b", "ash_p", "vra", "lts", "she", "gmm", "class_gmm", "residual", "relation", "nci", "gradnorm", "grad_uncertainty",
    "entropy", "temperature_scaling", "openmax",
]  # fmt: skip
#: the methods since the paper (issue 42), each at the end of its family's module
SINCE_PAPER = ["optfs", "webo", "pnml", "cfood", "kpca", "cadref", "ora", "weiper", "grood"]


def test_names_come_from_tags_and_order():
    assert detectors.names("paper21") == PAPER21  # the paper's order (Sec. 4.1), from `order=`
    # the others in registration order: the family modules' in the order they were first imported
    # (which a caller's own imports can change), each module's in its source order
    rest = [n for n in detectors.names() if n not in PAPER21]
    assert detectors.names()[:21] == PAPER21 and sorted(rest) == sorted(["cnc", *NETWORK, *PEERS, *SINCE_PAPER])
    assert [n for n in rest if n in NETWORK] == NETWORK
    # noise 0: MultiMahalanobis; the network methods since the paper (deep ensemble, AdaSCALE, i-ODIN) are in NETWORK
    assert detectors.names("network") == NETWORK
    assert sorted(detectors.names("since-paper")) == sorted([*SINCE_PAPER, "mahalanobis_ensemble", *NETWORK[5:]])
    assert detectors.names("paper21", "logit") == ["msp", "maxlogit", "kl_matching", "energy", "gen"]
    assert detectors.names("paper21", "hybrid") == ["vim", "nnguide"]
    assert len(detectors.names("paper21", "feature")) == 10 and len(detectors.names("paper21", "activation")) == 4
    assert detectors.names("cnc") == ["cnc"] and detectors.REGISTRY["cnc"].tags == {"logit", "cnc"}
    assert zeroshot.scorer_names("logit") == ["mcm", "maxlogit", "energy", "gen", "entropy", "margin", "gl_mcm"]
    assert zeroshot.scorer_names("needs-vocabulary") == ["neglabel", "eoe", "csp", "adaneg"]
    assert zeroshot.scorer_names("zeroshot") == zeroshot.scorer_names()
    for name in zeroshot.scorer_names():
        assert zeroshot.REGISTRY[name].uses_negatives == ("needs-vocabulary" in zeroshot.REGISTRY[name].tags)
    with pytest.raises(ValueError, match="unknown detector tag.*paper22.*tags: activation"):
        detectors.names("paper22")


def test_create_names_the_valid_names():
    with pytest.raises(KeyError, match="unknown detector 'mps'; known: msp, maxlogit"):
        detectors.create("mps")
    with pytest.raises(ValueError, match=r"detector 'energy' has no hyperparameter\(s\) t; it takes: compute_dtype, device, temperature"):
        detectors.create("energy", t=2.0)
    with pytest.raises(ValueError, match=r"zero-shot scorer 'gen' has no hyperparameter\(s\) m; it takes: gamma, tau, top_m"):
        zeroshot.create_scorer("gen", m=5)
    reg = Registry("widget", "oodeval.test-widgets")

    @reg.register("b", tags=("x",))
    class B:
        pass

    @reg.register("a", tags=("x", "y"), order=1)
    class A:
        pass

    assert reg.names() == ["a", "b"] and reg.names("y") == ["a"] and A.name == "a" and B.tags == {"x"}
    with pytest.raises(ValueError, match="widget 'a' registered twice"):
        reg.register("a")(B)


def test_one_hyperparameter_vocabulary_across_families():
    """The same idea has the same name in the post-hoc and the zero-shot family."""
    shared = {"energy": "temperature", "gen": "top_m", "mcm": "tau"}
    for name, param in shared.items():
        assert param in detectors.create(name).get_params(), name
        assert param in zeroshot.create_scorer(name).get_params(), name
    assert detectors.create("gen").get_params() == {"gamma": 0.1, "top_m": 100, "compute_dtype": "float32", "device": None}


def _cnc_folders(root):
    """A K+1 (CnC) model's FeatureSets: the synthetic problem plus an outlier logit and head row."""
    rng = np.random.default_rng(4)
    train, test, ood = synthetic_problem(n_classes=5, dim=16, n_train=300, n_test=80, n_ood=60, seed=3)
    w_out = rng.standard_normal((1, 16)).astype(np.float32)
    for name, fs, shift in (("train", train, 0.0), ("test", test, 0.0), ("far", ood, 6.0)):
        extra = (rng.standard_normal((len(fs), 1)) + shift).astype(np.float32)
        FeatureSet(fs.features, labels=fs.labels, logits=np.hstack([fs.logits, extra]),
                   weight=np.vstack([fs.weight, w_out]), bias=np.append(fs.bias, np.float32(0)),
                   extras=fs.extras, meta={"num_id_classes": 5, "outlier_class": 5}).save(root / name)  # fmt: skip
    return {n: FeatureSet.load(root / n) for n in ("train", "test", "far")}


def test_every_registered_detector_runs_in_score(tmp_path, capsys):
    sets = _cnc_folders(tmp_path)
    out = tmp_path / "scores.csv"
    argv = ["score", "--train", str(tmp_path / "train"), "--test", str(tmp_path / "test"),
            "--ood", f"far={tmp_path / 'far'}", "--set", "knn.k=5", "--set", "kpca.n_features=64", "--draws", "0",
            "--no-progress"]  # fmt: skip
    # the network methods read their extraction passes: tests/test_network_methods.py runs them in score
    names = [n for n in detectors.names() if n not in detectors.names("network")]
    assert main([*argv, "--detectors", ",".join(names), "--out", str(out)]) == 0
    table = pd.read_csv(out, comment="#")
    assert list(table.detector) == names
    # each row is that detector's own score: cnc reads the outlier column, the others the K-way view
    train, test, far = sets["train"], sets["test"], sets["far"]
    for name in names:
        det = detectors.create(name, **{"knn": {"k": 5}, "kpca": {"n_features": 64}}.get(name, {})).fit(train)
        row = table[table.detector == name].iloc[0]
        assert row.auroc == pytest.approx(auroc(det.score(test), det.score(far)), abs=1e-12), name
    k_way = FeatureSet(test.features, logits=np.asarray(test.logits)[:, :5])
    msp = detectors.create("msp").fit()
    assert np.array_equal(msp.score(test), msp.score(k_way))
    # the default selection picks cnc on a K+1 model's features, and never on a plain model's
    capsys.readouterr()
    assert main([*argv, "--detectors", "cnc,msp"]) == 0 and "cnc" in capsys.readouterr().out
    assert "cnc" in detectors.supported(train, test)
    assert "cnc" not in detectors.supported(None, FeatureSet(test.features, logits=test.logits))


def _doc_block(heading: str) -> str:
    """The first Python block under ``heading`` in docs/extending.md."""
    text = (Path(__file__).parents[1] / "docs" / "extending.md").read_text()
    return text.split(heading, 1)[1].split("```python\n", 1)[1].split("```", 1)[0]


def test_the_documented_plugin_detector_works_in_score(tmp_path, monkeypatch, capsys):
    """docs/extending.md's detector, named in the entry-point group, runs in `oodeval score`."""
    from importlib.metadata import EntryPoint

    import oodeval.registry

    (tmp_path / "doc_plugin_detectors.py").write_text(_doc_block("## A detector"))
    monkeypatch.syspath_prepend(str(tmp_path))
    plugin = EntryPoint(name="mine", value="doc_plugin_detectors", group="oodeval.detectors")
    monkeypatch.setattr(oodeval.registry, "entry_points", lambda group: [plugin] if group == plugin.group else [])
    reg = detectors.REGISTRY
    for attr in ("_classes", "_tags", "_order"):  # restored after the test: the plugin stays out of the others
        monkeypatch.setattr(reg, attr, dict(getattr(reg, attr)))
    monkeypatch.setattr(reg, "_loaded", False)
    assert detectors.names("feature")[-1] == "feature_norm" and "feature_norm" not in detectors.names("paper21")
    _cnc_folders(tmp_path)
    argv = ["score", "--train", str(tmp_path / "train"), "--test", str(tmp_path / "test"), "--ood", f"far={tmp_path / 'far'}",
            "--detectors", "feature_norm", "--set", "feature_norm.p=1", "--draws", "0", "--no-progress", "--out", str(tmp_path / "s.csv")]  # fmt: skip
    assert main(argv) == 0
    row = pd.read_csv(tmp_path / "s.csv", comment="#").iloc[0]
    test, far = FeatureSet.load(tmp_path / "test"), FeatureSet.load(tmp_path / "far")
    l1 = np.abs(np.asarray(test.features, np.float64)).sum(1), np.abs(np.asarray(far.features, np.float64)).sum(1)
    assert row.detector == "feature_norm" and row.auroc == pytest.approx(auroc(*l1), abs=1e-12)


def test_the_documented_zeroshot_scorer_registers(monkeypatch):
    reg = zeroshot.REGISTRY
    for attr in ("_classes", "_tags", "_order"):
        monkeypatch.setattr(reg, attr, dict(getattr(reg, attr)))
    exec(compile(_doc_block("## A zero-shot scorer"), "extending.md", "exec"), {})
    assert zeroshot.scorer_names("logit")[-1] == "lse_margin" and not reg["lse_margin"].uses_negatives
    rng = np.random.default_rng(0)
    image, text = (a / np.linalg.norm(a, axis=1, keepdims=True) for a in (rng.normal(size=(5, 8)), rng.normal(size=(3, 8))))
    logits = image @ text.T / 0.01
    got = zeroshot.score_zeroshot("lse_margin", image, text)
    # |logits| <= 1/tau = 100, so both sides carry float64 rounding of about 100 ulp(1) ~ 2e-14
    np.testing.assert_allclose(got, logits.max(1) - np.log(np.exp(logits).sum(1)), rtol=0, atol=1e-12)


def test_the_documented_report_view_appears_in_the_report(tmp_path, monkeypatch):
    """docs/extending.md's report view, one decorated function, is built and rendered in its place."""
    from oodeval.experiment import run_experiment
    from oodeval.report import VIEWS, build_views, write_report
    from oodeval.results import load_results

    for attr in ("_classes", "_tags", "_order"):  # restored after the test: the view stays out of the others
        monkeypatch.setattr(VIEWS, attr, dict(getattr(VIEWS, attr)))
    exec(compile(_doc_block("## A report view"), "extending.md", "exec"), {})
    keys = VIEWS.names()
    assert keys.index("tab3") < keys.index("mean_auroc") < keys.index("tabA1")
    _cnc_folders(tmp_path)
    paths = {role: str(tmp_path / name) for role, name in (("id_train", "train"), ("id_test", "test"), ("far", "far"))}
    results = run_experiment({
        "seeds": [0], "bootstrap_draws": 20, "results": str(tmp_path / "r.parquet"),
        "datasets": {"id_train": "train", "id_test": "test", "ood": ["far"]},
        "models": [{"name": "m", "features": paths}], "detectors": ["msp", "energy"],
    }, progress=False).results  # fmt: skip
    df = load_results(results)
    views, _ = build_views(df, results, draws=10)
    assert [v.key for v in views] == keys
    view = next(v for v in views if v.key == "mean_auroc")
    assert list(view.frame["Detector"]) == ["msp", "energy"]
    for det in ("msp", "energy"):
        assert view.frame.set_index("Detector").loc[det, "AUROC"] == f"{100 * df.set_index('detector').loc[det, 'auroc']:.2f}"
    md = write_report(results, tmp_path / "rep", draws=10)["markdown"].read_text()
    assert md.index("Tab. 3") < md.index("Mean AUROC over the OOD sets") < md.index("Tab. A1")
