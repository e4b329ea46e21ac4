"""NAC's taps (a backward pass per image) only for the ID-train rows NAC fits on."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from oodeval import detectors
from oodeval.data import Manifest
from oodeval.experiment import run_experiment
from oodeval.features import FeatureSet
from oodeval.features import taps as taps_mod
from oodeval.features.extract import extract, extract_nac_fit
from oodeval.results import load_results

KW = {"num_classes": 3, "pretrained_cfg_overlay": {"input_size": (3, 32, 32)}}


def _folder(root: Path, classes: tuple[str, ...], n: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(n):
            Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(root / c / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("nacfit")
    _folder(root / "train", ("a", "b", "c"), 5, 0)
    _folder(root / "test", ("a", "b", "c"), 2, 1)
    _folder(root / "ood", ("x",), 6, 2)
    return root


@pytest.fixture
def tapped_rows(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the images that go through NAC's forward + backward pass."""
    seen: list[int] = []
    real = taps_mod.forward_with_nac

    def counting(model, images, *args, **kwargs):
        seen.append(int(images.shape[0]))
        return real(model, images, *args, **kwargs)

    monkeypatch.setattr(taps_mod, "forward_with_nac", counting)
    return seen


def test_only_the_fitting_rows_are_tapped_and_nac_fits_the_same(data: Path, tmp_path: Path, tapped_rows: list[int]) -> None:
    full_path = extract("test_resnet", data / "train", tmp_path, model_kwargs=KW, taps=True, batch_size=1, progress=False)
    full = FeatureSet.load(full_path)
    assert sum(tapped_rows) == 15
    tapped_rows.clear()
    fit_path = extract_nac_fit("test_resnet", data / "train", tmp_path, n_fit=7, seed=3, model_kwargs=KW, batch_size=1,
                               progress=False)  # fmt: skip
    fit = FeatureSet.load(fit_path)
    assert sum(tapped_rows) == len(fit) == 6  # floor(7 / 3) = 2 rows per class: 6 backward passes instead of 15
    assert np.bincount(fit.labels).tolist() == [2, 2, 2]
    hp = {"n_fit": 7, "seed": 3, "layer_params": {k: {"alpha": 1.0} for k in ("pre_logits", "layer3", "layer2", "layer1")}}
    on_full = detectors.create("nac", **hp).fit(full)
    on_fit = detectors.create("nac", **hp).fit(fit)
    assert on_fit.fit_rows_.tolist() == list(range(6))
    # the very images NAC picks from a full tapped pass ...
    full_paths = Manifest.from_csv(full_path / "manifest.csv").paths
    assert Manifest.from_csv(fit_path / "manifest.csv").paths == [full_paths[i] for i in on_full.fit_rows_]
    # ... with the same states up to float32 summation order (the backward pass's reductions are
    # threaded): each state sums at most 256 spatial products, so 256 ulps of the layer's scale
    for name in on_full.layers_:
        want = np.asarray(full.extras[f"nac/{name}"][on_full.fit_rows_])
        scale = float(np.abs(want).max())
        np.testing.assert_allclose(fit.extras[f"nac/{name}"], want, rtol=0, atol=256 * np.finfo(np.float32).eps * scale)
    # n_fit of None (or >= N) taps every row, under the plain entry name
    every = extract_nac_fit("test_resnet", data / "train", tmp_path, n_fit=None, seed=0, model_kwargs=KW, progress=False)
    assert FeatureSet.load(every).meta["dataset"] == full.meta["dataset"]


def test_grid_taps_only_nac_fitting_rows(data: Path, tmp_path: Path, tapped_rows: list[int]) -> None:
    cfg = {"results": str(tmp_path / "r.parquet"), "store": str(tmp_path / "store"), "bootstrap_draws": 20, "seeds": [0],
           "batch_size": 4, "device": "cpu",
           "datasets": {"id_train": str(data / "train"), "id_test": str(data / "test"), "ood": [str(data / "ood")]},
           "models": [{"name": "test_resnet", "pretrained": False, "model_kwargs": KW}],
           "detectors": [{"name": "nac", "hyperparameters": {"n_fit": 3}}, "energy"]}  # fmt: skip
    df = load_results(run_experiment(cfg, progress=False)).set_index("detector")
    assert (df["status"] == "ok").all(), df["error"].tolist()
    assert sum(tapped_rows) == 3 + 6 + 6  # NAC's 3 fitting rows, the test set and the OOD set; not the 15 train images
    assert df.loc["nac", "hyperparameters_resolved"].count('"n_fit":3') == 1
    entries = [FeatureSet.load(m.parent) for m in (tmp_path / "store").glob("*/*/meta.json")]
    fits = {fs.meta["dataset"]: (len(fs), bool(fs.extras_with_prefix("nac/"))) for fs in entries}
    assert fits == {"train": (15, False), "train.nac-fit-3-seed0": (3, True), "test": (6, True), "ood": (6, True)}


def test_cli_extracts_the_fitting_rows_and_score_fits_nac_on_them(data: Path, tmp_path: Path, capsys, tapped_rows) -> None:
    from oodeval import cli

    kw = ["--model", "test_resnet", "--pretrained", "none", "--store", str(tmp_path), "--model-kwargs", json.dumps(KW), "--no-progress",
          "--device", "cpu"]  # fmt: skip
    paths = {}
    for name, extra in (("train", []), ("fit", ["--nac-fit", "4", "--seed", "1"]), ("test", ["--taps"]), ("ood", ["--taps"])):
        ds = data / ("train" if name == "fit" else name)
        assert cli.main(["extract", "--dataset", str(ds), *kw, *extra]) == 0
        paths[name] = capsys.readouterr().out.splitlines()[0]
    assert sum(tapped_rows) == 3 + 6 + 6 and len(FeatureSet.load(paths["fit"])) == 3
    base = ["score", "--train", paths["train"], "--test", paths["test"], "--ood", f"o={paths['ood']}", "--no-progress"]
    assert cli.main([*base, "--nac-train", paths["fit"], "--detectors", "nac,energy", "--set", "nac.n_fit=4"]) == 0
    out = capsys.readouterr().out
    assert "nac.n_fit = 4 (set explicitly; backbone default 1000" in out and "\nnac " in out and "\nenergy " in out
    # without --nac-train the untapped train set cannot serve NAC: it is left out of the default list
    assert cli.main([*base, "--set", "knn.k=5"]) == 0
    assert "\nnac " not in capsys.readouterr().out
    assert cli.main([*base, "--set", "knn.k=5", "--nac-train", paths["fit"]]) == 0
    assert "\nnac " in capsys.readouterr().out


def test_validation_search_fits_nac_on_its_tapped_rows(data: Path, tmp_path: Path, tapped_rows: list[int]) -> None:
    """The search builds each candidate through the grid's seam, so NAC fits on its tapped rows there
    too (it used to get the untapped ID-train set and fail)."""
    _folder(tmp_path / "val", ("a", "b", "c"), 2, 3)
    _folder(tmp_path / "valood", ("x",), 4, 4)
    cfg = {"results": str(tmp_path / "r.parquet"), "store": str(tmp_path / "store"), "bootstrap_draws": 20, "seeds": [0],
           "batch_size": 4, "device": "cpu",
           "datasets": {"id_train": str(data / "train"), "id_test": str(data / "test"), "ood": [str(data / "ood")]},
           "selection": {"validation_id": str(tmp_path / "val"), "validation_ood": str(tmp_path / "valood")},
           "models": [{"name": "test_resnet", "pretrained": False, "model_kwargs": KW}],
           "detectors": [{"name": "nac", "hyperparameters": {"n_fit": 3}, "search": {"seed": [0, 1]}}]}  # fmt: skip
    df = load_results(run_experiment(cfg, progress=False))
    assert (df["status"] == "ok").all(), df["error"].tolist()
    assert df["selection"].iloc[0].startswith("validation: seed=")
    entries = [FeatureSet.load(m.parent) for m in (tmp_path / "store").glob("*/*/meta.json")]
    fits = {fs.meta["dataset"]: len(fs) for fs in entries if "nac-fit" in fs.meta["dataset"]}
    assert fits == {"train.nac-fit-3-seed0": 3, "train.nac-fit-3-seed1": 3}  # each candidate's own rows
