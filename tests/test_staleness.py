"""No number is reused once what produced it changed (issue 26, Deliver 2).

Each test changes one input under the same name and reruns: the numbers follow the new input,
or the run refuses; the old numbers with exit 0 would fail it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from oodeval.cli import main
from oodeval.detectors._synthetic import synthetic_problem
from oodeval.experiment import run_experiment
from oodeval.features import FeatureSet
from oodeval.features.extract import extract
from oodeval.metrics import all_metrics
from oodeval.results import load_results


@pytest.fixture
def sets(tmp_path: Path) -> Path:
    train, test, ood = synthetic_problem(n_classes=3, dim=8, n_train=60, n_test=40, n_ood=40, seed=0)
    for name, fs in {"train": train, "test": test, "ood": ood}.items():
        fs.save(tmp_path / name)
    return tmp_path


def _score(sets: Path, out: Path) -> list[str]:
    return ["score", "--train", str(sets / "train"), "--test", str(sets / "test"), "--ood", f"o={sets / 'o'}",
            "--detectors", "msp", "--draws", "20", "--no-progress", "--out", str(out)]  # fmt: skip


def test_changed_ood_content_under_the_same_name_is_scored_again(sets: Path, capsys) -> None:
    test = FeatureSet.load(sets / "test")
    near = FeatureSet.load(sets / "ood")
    near.save(sets / "o")
    out = sets / "t.parquet"
    assert main(_score(sets, out)) == 0
    first = load_results(out).set_index("dataset").loc["o", "auroc"]
    test.save(sets / "o")  # the OOD folder now holds the ID test images: AUROC 0.5
    assert main(_score(sets, out)) == 0
    row = load_results(out).set_index("dataset").loc["o"]
    assert row["auroc"] == pytest.approx(0.5, abs=1e-12) and first > 0.9
    assert "1 cells computed" in capsys.readouterr().out


def test_changed_bootstrap_settings_recompute_the_intervals(sets: Path) -> None:
    exp = {"results": str(sets / "r.parquet"), "seeds": [0], "bootstrap_draws": 20,
           "datasets": {"id_train": "train", "id_test": "test", "ood": ["far"]},
           "models": [{"name": "m", "features": {"id_train": str(sets / "train"), "id_test": str(sets / "test"), "far": str(sets / "ood")}}],
           "detectors": ["msp"]}  # fmt: skip
    first = run_experiment(exp, progress=False)
    lo20 = load_results(first.results).iloc[0]["auroc_lo"]
    assert run_experiment(exp, progress=False).computed == 0  # nothing changed: nothing recomputed
    for change in ({"bootstrap_draws": 200}, {"bootstrap_draws": 200, "bootstrap_fixed_id": False}):
        again = run_experiment({**exp, **change}, progress=False)
        row = load_results(again.results).iloc[0]
        assert again.computed == 1 and row["bootstrap_draws"] == 200
        assert bool(row["bootstrap_fixed_id"]) == change.get("bootstrap_fixed_id", True)
    assert row["auroc_lo"] != lo20


KW = {"num_classes": 2, "pretrained_cfg_overlay": {"input_size": [3, 24, 24]}}


def test_an_image_replaced_in_place_is_extracted_again(tmp_path: Path) -> None:
    root = tmp_path / "imgs"
    rng = np.random.default_rng(3)
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(2):
            Image.fromarray(rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)).save(root / c / f"{i}.png")
    store = tmp_path / "store"
    first = extract("test_resnet", root, store, model_kwargs=KW, batch_size=4, progress=False)
    before = FeatureSet.load(first).features.copy()
    target = root / "a" / "0.png"
    stat = target.stat()
    Image.fromarray(rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)).save(target)
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same mtime: the sampled bytes differ
    assert target.stat().st_size == stat.st_size
    second = extract("test_resnet", root, store, model_kwargs=KW, batch_size=4, progress=False)
    after = FeatureSet.load(second).features
    assert second != first
    assert not np.allclose(after[0], before[0]) and np.allclose(after[1:], before[1:], atol=1e-5)
    full = extract("test_resnet", root, store, model_kwargs=KW, batch_size=4, progress=False, full_image_hash=True)
    assert full not in (first, second) and np.allclose(FeatureSet.load(full).features, after, atol=1e-5)


def test_a_flipped_byte_in_a_feature_array_is_refused(sets: Path, capsys) -> None:
    f = sets / "ood" / "features.npy"
    data = bytearray(f.read_bytes())
    data[-3] ^= 0x01  # one bit of the last feature value
    f.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="do not match the content hash"):
        FeatureSet.load(sets / "ood")
    FeatureSet.load(sets / "ood", verify=False)  # readable, but not trusted for scoring
    (sets / "o").symlink_to(sets / "ood")
    assert main(_score(sets, sets / "t.csv")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"FeatureSet {sets / 'o'}" in err and "content hash" in err
    assert not (sets / "t.csv").exists()


def test_the_ood_numbers_are_those_of_the_current_folder(sets: Path) -> None:
    """The stale-case numbers above are the right ones: msp from the stored logits, recomputed here."""
    from scipy.special import softmax

    test, ood = FeatureSet.load(sets / "test"), FeatureSet.load(sets / "ood")
    ood.save(sets / "o")
    out = sets / "t.parquet"
    assert main(_score(sets, out)) == 0
    msp = lambda fs: softmax(np.asarray(fs.logits, np.float64), axis=1).max(axis=1)  # noqa: E731
    ref = all_metrics(msp(test), msp(ood))
    row = load_results(out).set_index("dataset").loc["o"]
    assert row["auroc"] == pytest.approx(ref["auroc"], abs=1e-12) and isinstance(load_results(out), pd.DataFrame)
