"""The demo's offline benchmark builder and its experiment file (no training here)."""

import json
import tomllib

import numpy as np
import pytest

from oodeval.data import resolve
from oodeval.demo.data import (
    ID_CLASSES,
    NEAR_OOD_CLASSES,
    SET_NAMES,
    DemoSizes,
    build_benchmark,
    load_fashion_mnist,
    read_set,
)
from oodeval.demo.run import to_toml


TINY = DemoSizes(id_train=60, id_test=30, near_ood=20, digits=10, photos=16, uniform=5, gaussian=5)


@pytest.mark.needs("fashion-mnist")
def test_fashion_mnist_idx_parsed():
    fm = load_fashion_mnist()
    x, y = fm["train"]
    assert x.shape == (60000, 28, 28) and x.dtype == np.uint8
    assert np.array_equal(np.bincount(y), np.full(10, 6000))
    assert fm["test"][0].shape == (10000, 28, 28)
    assert not set(ID_CLASSES) & set(NEAR_OOD_CLASSES) and len(set(ID_CLASSES) | set(NEAR_OOD_CLASSES)) == 10


@pytest.mark.needs("fashion-mnist")
def test_sets_built_as_registry_datasets(tmp_path):
    sets = build_benchmark(tmp_path, TINY, seed=3, progress=False)
    assert set(sets) == set(SET_NAMES)
    train = resolve(SET_NAMES["id_train"], tmp_path)
    assert len(train) == TINY.id_train and train.num_classes == len(ID_CLASSES)
    assert np.array_equal(np.bincount(train.labels), np.full(6, TINY.id_train // 6))
    near = resolve(SET_NAMES["near_ood"], tmp_path)
    assert (near.labels == -1).all() and set(near.ood_label) == {"Pullover", "Coat", "Shirt", "Sneaker"}
    for role in ("digits", "photos", "uniform", "gaussian"):
        images, labels, build = read_set(sets[role])
        assert images.shape == (getattr(TINY, role), 28, 28) and images.dtype == np.uint8
        assert (labels == -1).all() and build["role"] == role
    digits, _, _ = read_set(sets["digits"])
    assert digits[:, :4].max() == 0 and digits[:, 24:].max() == 0 and digits.max() > 200  # 20x20 box in 28x28
    photos, _, _ = read_set(sets["photos"])
    assert photos.std(axis=(1, 2)).min() > 0
    # the ID sets' pixels are the Fashion-MNIST pixels of their class
    fm = load_fashion_mnist()
    images, labels, _ = read_set(sets["id_test"])
    pool = fm["test"][0][fm["test"][1] == ID_CLASSES[labels[0]]]
    assert (pool.reshape(len(pool), -1) == images[0].reshape(1, -1)).all(axis=1).any()


@pytest.mark.needs("fashion-mnist")
def test_build_is_deterministic_and_cached(tmp_path):
    a = build_benchmark(tmp_path / "a", TINY, seed=1, progress=False)
    b = build_benchmark(tmp_path / "b", TINY, seed=1, progress=False)
    c = build_benchmark(tmp_path / "c", TINY, seed=2, progress=False)
    for role in SET_NAMES:
        ha = json.loads((a[role] / "build.json").read_text())["content_hash"]
        assert ha == json.loads((b[role] / "build.json").read_text())["content_hash"]
        assert (a[role] / "images" / "000000.png").read_bytes() == (b[role] / "images" / "000000.png").read_bytes()
    changed = [r for r in SET_NAMES if json.loads((c[r] / "build.json").read_text())["content_hash"]
               != json.loads((a[r] / "build.json").read_text())["content_hash"]]
    assert len(changed) == len(SET_NAMES)
    stamp = {r: (a[r] / "manifest.csv").stat().st_mtime_ns for r in SET_NAMES}
    build_benchmark(tmp_path / "a", TINY, seed=1, progress=False)
    assert stamp == {r: (a[r] / "manifest.csv").stat().st_mtime_ns for r in SET_NAMES}
    bigger = DemoSizes(**{**TINY.__dict__, "uniform": 6})
    build_benchmark(tmp_path / "a", bigger, seed=1, progress=False)
    assert len(resolve(SET_NAMES["uniform"], tmp_path / "a")) == 6


@pytest.mark.needs("fashion-mnist")
def test_sizes_validated(tmp_path):
    with pytest.raises(ValueError, match="at least 1 image"):
        DemoSizes(photos=0)
    with pytest.raises(ValueError, match="asked for 4001 images of classes .* only 4000 exist"):
        build_benchmark(tmp_path, DemoSizes(near_ood=4001), progress=False)
    assert not any(tmp_path.iterdir())


def test_experiment_toml_round_trips():
    exp = {
        "name": "x",
        "seeds": [0],
        "bootstrap_draws": 10,
        "datasets": {"id_test": "a", "ood": [{"name": "b", "label": "b b"}]},
        "models": [{"name": "m", "pretrained": False, "model_kwargs": {"in_chans": 1, "overlay": {"mean": (0.5,), "crop_pct": 1.0, "s": 'q"uote'}}, "taps": True}],
        "detectors": ["msp", {"name": "knn", "hyperparameters": {"k": 3}}],
    }
    back = tomllib.loads(to_toml(exp))
    exp["models"][0]["model_kwargs"]["overlay"]["mean"] = [0.5]
    assert back == exp
