"""K+1 training: the head, ID prediction over the first K, a falling loss, checkpoints, resume."""

import json

import numpy as np
import pytest

from oodeval.cnc.train import TrainConfig, build_model, extract, id_predictions, load_checkpoint, to_tensor, train


def _toy(n=96, k=3, size=16, seed=0):
    """Grey images whose class is the position of a bright bar (learnable in a few steps)."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % k
    images = rng.integers(0, 60, size=(n, size, size), dtype=np.uint8)
    for i, c in enumerate(labels):
        images[i, :, c * 5 : c * 5 + 4] = 230
    return images, labels


def _cfg(**kw):
    base = dict(model="test_resnet", num_classes=3, in_chans=1, epochs=3, batch_size=32, lr=0.05, seed=0,
                corruptions=("contrast", "gaussian_noise", "pixelate"))  # fmt: skip
    base.update(kw)
    return TrainConfig(**base)


def test_k_plus_one_head_and_plain_head():
    import torch

    x = to_tensor(_toy(n=4)[0])
    assert tuple(x.shape) == (4, 1, 16, 16)
    torch.manual_seed(0)
    assert tuple(build_model(_cfg()).eval()(x).shape) == (4, 4)
    assert tuple(build_model(_cfg(cnc=False)).eval()(x).shape) == (4, 3)
    assert _cfg().outputs == 4 and _cfg(cnc=False).outputs == 3
    # any timm model: a ViT gets the same K+1 linear head
    vit = _cfg(model="test_vit", model_kwargs={"img_size": 16, "patch_size": 8})
    fs = extract(build_model(vit), _toy(n=4)[0], vit)
    assert fs.logits.shape == (4, 4) and fs.weight.shape[0] == 4
    np.testing.assert_allclose(fs.features @ fs.weight.T + fs.bias, fs.logits, rtol=1e-4, atol=1e-4)


def test_id_prediction_ignores_the_outlier_column():
    logits = np.array([[0.1, 2.0, 0.3, 9.0], [3.0, 0.0, 1.0, 5.0], [0.0, 0.0, 4.0, -1.0]])
    assert list(id_predictions(logits, 3)) == [1, 0, 2]
    with pytest.raises(ValueError, match="logits"):
        id_predictions(logits[:, :2], 3)


def test_config_validation():
    with pytest.raises(ValueError, match="num_classes"):
        _cfg(num_classes=1)
    with pytest.raises(ValueError, match="corruptions"):
        _cfg(corruptions=("fog", "nope"))
    with pytest.raises(ValueError, match="class_ids"):
        _cfg(class_ids=(0, 1))
    cfg = _cfg(class_ids=(2, 5, 7))
    assert TrainConfig.from_json(json.loads(json.dumps(cfg.to_json()))) == cfg


def test_training_loss_falls_and_checkpoint_loads(tmp_path):
    images, labels = _toy()
    prog = train(_cfg(epochs=4), images, labels, tmp_path / "ck", progress=False)
    losses = [h["loss"] for h in prog["history"]]
    assert len(losses) == 4 and losses[-1] < 0.8 * losses[0], losses
    assert all("loss_outlier" in h for h in prog["history"])
    for f in ("model.safetensors", "optimizer.safetensors", "optimizer.json", "config.json", "progress.json"):
        assert (tmp_path / "ck" / f).is_file()
    model, cfg, p2 = load_checkpoint(tmp_path / "ck")
    assert cfg == _cfg(epochs=4) and p2["epochs_done"] == 4
    fs = extract(model, images[:10], cfg, labels[:10])
    assert fs.logits.shape == (10, 4) and fs.weight.shape == (4, fs.features.shape[1])
    assert fs.meta["outlier_class"] == 3 and fs.meta["num_id_classes"] == 3
    # the linear head reproduces the stored logits
    np.testing.assert_allclose(fs.features @ fs.weight.T + fs.bias, fs.logits, rtol=1e-4, atol=1e-4)


def test_resume_gives_the_uninterrupted_weights(tmp_path):
    from safetensors.numpy import load_file

    images, labels = _toy(n=64)
    cfg = _cfg(epochs=2)
    train(cfg, images, labels, tmp_path / "full", progress=False)
    first = train(cfg, images, labels, tmp_path / "split", progress=False, stop_after=1)
    assert first["epochs_done"] == 1
    done = train(cfg, images, labels, tmp_path / "split", progress=False)
    assert done["epochs_done"] == 2
    a = load_file(str(tmp_path / "full" / "model.safetensors"))
    b = load_file(str(tmp_path / "split" / "model.safetensors"))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    # another config or other data in the same folder is refused
    with pytest.raises(ValueError, match="other settings"):
        train(_cfg(epochs=2, lr=0.01), images, labels, tmp_path / "split", progress=False)
    with pytest.raises(ValueError, match="other data"):
        train(cfg, images[::-1].copy(), labels[::-1].copy(), tmp_path / "split", progress=False)


def test_bad_training_data_is_rejected(tmp_path):
    images, labels = _toy(n=40)
    with pytest.raises(ValueError, match="labels outside"):
        train(_cfg(), images, labels + 1, tmp_path / "x", progress=False)
    with pytest.raises(ValueError, match="channel"):
        train(_cfg(in_chans=3), images, labels, tmp_path / "x", progress=False)
