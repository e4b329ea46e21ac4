"""Declared hyperparameter constraints (oodeval.params): refused when built, when an experiment file
is loaded (all problems at once, before any extraction) and by `score --set` before scoring."""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
import pytest

from oodeval import cli, detectors
from oodeval.errors import InputError
from oodeval.experiment import grid, load_config, runner
from oodeval.params import Device, Interval, Options
from oodeval.zeroshot import scorers

EXPERIMENT = """
seeds = [0]
{top}
[datasets]
id_train = "train"
id_test = "test"
ood = ["far"]
[[models]]
name = "my_nets:tiny"
pretrained = false
[[detectors]]
name = "knn"
hyperparameters = {{ k = {k} }}
[[detectors]]
name = "mahalanobis"
hyperparameters = {{ compute_dtype = "{dtype}" }}
[[detectors]]
name = "vim"
hyperparameters = {{ device = "{device}" }}
"""


def test_interval_options_and_device_say_their_limits():
    k, frac = Interval(Integral, 1, None), Interval(Real, 0, 1, closed="right")
    assert k.accepts(1) and k.accepts(np.int64(7)) and not k.accepts(0) and not k.accepts(2.0) and not k.accepts(True)
    assert frac.accepts(1.0) and not frac.accepts(0.0) and not frac.accepts(float("nan")) and not frac.accepts(1.5)
    assert (str(k), str(frac)) == ("an integer >= 1", "a number in (0, 1]")
    assert Options("float32", "float64").accepts("float64") and not Options("float32", "float64").accepts("float16")
    assert Device().accepts("cuda:1") and Device().accepts("cpu") and not Device().accepts("cdua") and not Device().accepts("cuda:")


def test_construction_set_params_and_clone_refuse_out_of_range_values():
    from sklearn.base import clone

    with pytest.raises(InputError, match=r"detector 'knn': k=-5 must be an integer >= 1"):
        detectors.create("knn", k=-5)
    with pytest.raises(InputError, match=r"detector 'knn': k=-5 must be an integer >= 1"):
        detectors.REGISTRY["knn"](k=-5)  # the class itself, not only the registry
    det = detectors.create("knn", k=5)
    with pytest.raises(InputError, match=r"bank_fraction=0 must be a number in \(0, 1\]"):
        det.set_params(bank_fraction=0)
    assert det.get_params()["bank_fraction"] == 1.0  # a refused set_params changes nothing
    assert clone(det).get_params() == det.get_params()
    det.k = 0  # past the checks: fit refuses it
    with pytest.raises(InputError, match=r"k=0 must be an integer >= 1"):
        det.fit(None)
    with pytest.raises(InputError, match=r"has no hyperparameter\(s\) tempreature \(did you mean temperature\?\)"):
        detectors.create("msp", tempreature=2.0)


def test_zero_shot_scorers_refuse_out_of_range_values_when_built():
    with pytest.raises(InputError, match=r"zero-shot scorer 'mcm': tau=0 must be a number > 0"):
        scorers.create_scorer("mcm", tau=0)
    with pytest.raises(InputError, match=r"zero-shot scorer 'margin': space='log' must be one of 'logit', 'prob'"):
        scorers.Margin(space="log")
    with pytest.raises(InputError, match=r"n_groups=0 must be an integer >= 1"):
        scorers.create_scorer("neglabel").set_params(n_groups=0)


@pytest.mark.parametrize("name", scorers.scorer_names())
def test_every_zero_shot_scorer_declares_every_hyperparameter_and_refuses_outside_values(name):
    cls = scorers.REGISTRY[name]
    params = cls().get_params()
    assert set(cls.constraints) == set(params), f"{name}: constraints {sorted(cls.constraints)} vs {sorted(params)}"
    for key, constraint in cls.constraints.items():
        for alternative in constraint if isinstance(constraint, tuple) else (constraint,):
            for bad in [] if alternative is None else alternative.outside():
                with pytest.raises(InputError, match=f"zero-shot scorer '{name}': {key}="):
                    cls(**{key: bad})


def _spy(monkeypatch) -> list:
    calls: list = []

    def extract(*args, **kwargs):
        calls.append(args)
        raise RuntimeError("extraction was reached")

    monkeypatch.setattr(grid, "extract_experiment_features", extract)  # the default FeatureSet source of run_experiment
    return calls


def test_run_check_names_all_three_bad_values_before_any_extraction(tmp_path, capsys, monkeypatch):
    calls = _spy(monkeypatch)
    (tmp_path / "my_nets.py").write_text("def tiny():\n    raise AssertionError('never built: extraction is replaced')\n")
    exp = tmp_path / "exp.toml"
    exp.write_text(EXPERIMENT.format(top="", k=-5, dtype="float16", device="cdua"))
    for args in (["run", str(exp), "--check"], ["run", str(exp), "--no-progress"]):
        assert cli.main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith("oodeval run: error: experiment file: 3 problem(s) with hyperparameters or devices")
        assert "detectors[0]: detector 'knn': k=-5 must be an integer >= 1" in err
        assert "detectors[1]: detector 'mahalanobis': compute_dtype='float16' must be one of 'float32', 'float64'" in err
        assert "detectors[2]: detector 'vim': device='cdua' must be a torch device ('cpu', 'cuda', 'cuda:N') or None" in err
    assert calls == [] and not (tmp_path / "store").exists() and not (tmp_path / "results.parquet").exists()
    # the same file with good values reaches extraction: the spy above would have seen a late check
    exp.write_text(EXPERIMENT.format(top="", k=5, dtype="float64", device="cpu"))
    assert cli.main(["run", str(exp), "--no-progress"]) == 1
    assert calls


def test_experiment_device_values_are_checked_and_detector_device_is_read(tmp_path):
    exp = tmp_path / "exp.toml"
    exp.write_text(EXPERIMENT.format(top='device = "gpu"\ndetector_device = "cuda:x"', k=5, dtype="float64", device="cpu"))
    with pytest.raises(InputError) as err:
        load_config(exp)
    assert "top level: device='gpu' must be 'auto' or a torch device" in str(err.value)
    assert "top level: detector_device='cuda:x' must be 'auto' or a torch device" in str(err.value)
    exp.write_text(EXPERIMENT.format(top='device = "cpu"', k=5, dtype="float64", device="cpu"))
    assert load_config(exp).detector_device is None  # default: the detectors compute with numpy
    exp.write_text(EXPERIMENT.format(top='device = "cpu"\ndetector_device = "auto"', k=5, dtype="float64", device="cpu"))
    assert load_config(exp).detector_device == "auto"


def test_detector_device_reaches_the_detectors_and_an_explicit_device_wins(tmp_path):
    from dataclasses import replace

    from oodeval.scorer_factory import RunSets, build_scorer

    exp = tmp_path / "exp.toml"
    exp.write_text(EXPERIMENT.format(top='device = "cpu"', k=5, dtype="float64", device="cpu"))
    cfg = load_config(exp)
    assert runner._detector_device(cfg) is None  # no detector_device: numpy, as before
    assert runner._detector_device(replace(cfg, detector_device="auto")) == "cpu"  # the experiment's device
    assert runner._detector_device(replace(cfg, detector_device="cuda:1")) == "cuda:1"
    sets = RunSets(None, None)
    assert build_scorer("knn", {"k": 5}, sets).detector.device is None
    assert build_scorer("knn", {"k": 5}, sets, device="cpu").detector.device == "cpu"
    assert build_scorer("vim", {"device": "cuda"}, sets, device="cpu").detector.device == "cuda"  # explicit wins
    assert "device" not in build_scorer("nac", {}, sets, device="cuda:1").detector.get_params()  # nac takes no device


def test_detector_device_is_recorded_in_the_rows_and_scores_as_numpy_does(tmp_path):
    import json

    from oodeval.results import load_results

    tables = {}
    for name, top in (("numpy", {}), ("torch", {"detector_device": "cpu"})):
        tables[name] = load_results(_tiny_run(tmp_path / name, tmp_path / name / "r.parquet", ["msp", "cosine"], **top))
    for det in ("msp", "cosine"):
        rows = {k: t[(t["detector"] == det) & (t["split"] == "all")].iloc[0] for k, t in tables.items()}
        devices = {k: json.loads(r["hyperparameters_resolved"])["device"] for k, r in rows.items()}
        assert devices == {"numpy": None, "torch": "cpu"}
        assert rows["numpy"]["hyperparameters"] == rows["torch"]["hyperparameters"] == "{}"
        assert rows["numpy"]["auroc"] == pytest.approx(rows["torch"]["auroc"], abs=1e-9)


def test_search_candidates_and_sweeps_are_checked_too(tmp_path):
    exp = tmp_path / "exp.toml"
    text = EXPERIMENT.format(top="", k=5, dtype="float64", device="cpu")
    text = text.replace("hyperparameters = { k = 5 }", "search = { k = [10, 0, 50] }")
    exp.write_text(text + '[selection]\nvalidation_id = "val"\nvalidation_ood = "vood"\n')
    with pytest.raises(InputError, match=r"detectors\[0\] search: detector 'knn': k=0 must be an integer >= 1"):
        load_config(exp)


def test_the_old_name_precision_is_refused_in_files_and_on_the_command_line(tmp_path, capsys):
    exp = tmp_path / "exp.toml"
    exp.write_text(EXPERIMENT.format(top="", k=5, dtype="float64", device="cpu").replace("compute_dtype", "precision"))
    assert cli.main(["run", str(exp), "--check"]) == 2
    assert "detector 'mahalanobis': precision was renamed to compute_dtype; write compute_dtype instead" in capsys.readouterr().err
    with pytest.raises(InputError, match="precision was renamed to compute_dtype"):
        detectors.create("knn", precision="float32")


@pytest.fixture
def feature_sets(tmp_path):
    from oodeval.testing import small_problem

    train, test, ood = small_problem()
    return {name: str(fs.save(tmp_path / name)) for name, fs in (("train", train), ("test", test), ("ood", ood))}


def test_score_set_refuses_bad_values_before_scoring(feature_sets, capsys, monkeypatch):
    from oodeval import evaluation

    scored: list = []
    real = evaluation.fit_score_evaluate
    monkeypatch.setattr(evaluation, "fit_score_evaluate", lambda *a, **k: scored.append(a) or real(*a, **k))
    base = ["score", "--train", feature_sets["train"], "--test", feature_sets["test"], "--ood", f"far={feature_sets['ood']}",
            "--detectors", "knn,msp", "--draws", "0", "--no-progress"]  # fmt: skip
    assert cli.main([*base, "--set", "knn.k=-5", "--set", "msp.precision=float64"]) == 2
    err = capsys.readouterr().err
    assert "detector 'knn': k=-5 must be an integer >= 1" in err and "precision was renamed to compute_dtype" in err
    assert scored == []
    assert cli.main([*base, "--set", "knn.k=5", "--set", "msp.compute_dtype=float64"]) == 0
    assert scored  # the same command with good values scores


def test_old_results_recording_precision_still_load(tmp_path):
    """Rows written before the rename record ``precision`` in hyperparameters_resolved: only shown."""
    import json

    from oodeval.results import load_results, save_results

    table = tmp_path / "results.parquet"
    fresh = tmp_path / "fresh.parquet"
    summary = _tiny_run(tmp_path, fresh)
    df = load_results(summary)
    old = df.assign(hyperparameters_resolved=df["hyperparameters_resolved"].str.replace("compute_dtype", "precision"))
    save_results(old, table)
    back = load_results(table)
    assert json.loads(back["hyperparameters_resolved"].iloc[0])["precision"] == "float32"


def _tiny_run(tmp_path, results, names=("msp",), **top):
    from oodeval.experiment import run_experiment
    from oodeval.testing import small_problem

    sets = dict(zip(("id_train", "id_test", "far"), small_problem()))
    paths = {role: str(fs.save(tmp_path / "feats" / role)) for role, fs in sets.items()}
    return run_experiment({"results": str(results), "bootstrap_draws": 10, "seeds": [0], **top,
                           "datasets": {"id_train": "id_train", "id_test": "id_test", "ood": ["far"]},
                           "models": [{"name": "synthetic", "features": paths}], "detectors": list(names)},
                          progress=False).results  # fmt: skip
