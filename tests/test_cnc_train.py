"""K+1 training: the head, ID prediction over the first K, a falling loss, checkpoints, resume."""

import json

import numpy as np
import pytest

from oodeval.cnc.train import (
    TrainConfig, build_model, extract, id_predictions, load_checkpoint, lr_at, milestone_epochs, to_tensor, train,
)  # fmt: skip


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
    for f in ("config.json", "progress.json", "epoch-0004/model.safetensors", "epoch-0004/optimizer.safetensors",
              "epoch-0004/optimizer.json"):  # fmt: skip
        assert (tmp_path / "ck" / f).is_file()
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == [".oodeval-output.jsonl", "config.json", "epoch-0004",
                                                                   "progress.json"]
    model, cfg, p2 = load_checkpoint(tmp_path / "ck")
    assert p2["epochs_done"] == 4
    # the stored config records what the data and the installation fixed
    assert cfg.image_size == (16, 16) and cfg.in_chans == 1 and cfg.num_classes == 3 and len(cfg.data_hash) == 32
    assert cfg == _cfg(epochs=4, image_size=(16, 16), data_hash=cfg.data_hash, frost=cfg.frost)
    fs = extract(model, images[:10], cfg, labels[:10])
    assert fs.logits.shape == (10, 4) and fs.weight.shape == (4, fs.features.shape[1])
    assert fs.meta["outlier_class"] == 3 and fs.meta["num_id_classes"] == 3
    # the linear head reproduces the stored logits
    np.testing.assert_allclose(fs.features @ fs.weight.T + fs.bias, fs.logits, rtol=1e-4, atol=1e-4)


def _weights(folder):
    from safetensors.numpy import load_file

    prog = json.loads((folder / "progress.json").read_text())
    return load_file(str(folder / prog["checkpoint"] / "model.safetensors"))


def _same(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_schedule_is_a_function_of_config_and_epoch():
    cfg = _cfg(epochs=4)
    assert milestone_epochs(cfg) == [2, 3]
    assert [lr_at(cfg, e) for e in range(4)] == pytest.approx([0.05, 0.05, 0.005, 0.0005], rel=1e-12)
    # 0.5 and 0.75 of 3 epochs both round to epoch 2: the rate still decays once per milestone
    few = _cfg(epochs=3)
    assert milestone_epochs(few) == [2, 2]
    assert [lr_at(few, e) for e in range(3)] == pytest.approx([0.05, 0.05, 0.0005], rel=1e-12)
    with pytest.raises(ValueError, match="milestones"):
        _cfg(milestones=(100, 150))


def test_resume_across_two_milestones_is_bit_identical(tmp_path):
    images, labels = _toy(n=32)
    cfg = _cfg(epochs=3, batch_size=16, milestones=(0.34, 0.67))
    assert milestone_epochs(cfg) == [1, 2]
    full = train(cfg, images, labels, tmp_path / "full", progress=False)
    assert [h["lr"] for h in full["history"]] == pytest.approx([0.05, 0.005, 0.0005], rel=1e-12)
    # interrupted after epoch 1 and after epoch 2: each resume starts on a milestone
    assert train(cfg, images, labels, tmp_path / "split", progress=False, stop_after=1)["epochs_done"] == 1
    assert train(cfg, images, labels, tmp_path / "split", progress=False, stop_after=1)["epochs_done"] == 2
    done = train(cfg, images, labels, tmp_path / "split", progress=False)
    assert [h["lr"] for h in done["history"]] == [h["lr"] for h in full["history"]]
    assert [h["loss"] for h in done["history"]] == [h["loss"] for h in full["history"]]
    assert _same(_weights(tmp_path / "full"), _weights(tmp_path / "split"))
    # another config or other data in the same folder is refused
    with pytest.raises(ValueError, match="other settings"):
        train(_cfg(epochs=3, batch_size=16, milestones=(0.34, 0.67), lr=0.01), images, labels, tmp_path / "split",
              progress=False)  # fmt: skip
    with pytest.raises(ValueError, match="other data"):
        train(cfg, images[::-1].copy(), labels[::-1].copy(), tmp_path / "split", progress=False)


def test_a_kill_while_writing_a_checkpoint_keeps_the_last_epoch(tmp_path, monkeypatch):
    import safetensors.torch

    images, labels = _toy(n=32)
    cfg = _cfg(epochs=3, batch_size=16)
    train(cfg, images, labels, tmp_path / "full", progress=False)
    run = tmp_path / "run"
    train(cfg, images, labels, run, progress=False, stop_after=1)
    real = safetensors.torch.save_file
    calls = []

    def dies_midway(tensors, path, *a, **k):
        calls.append(path)
        if len(calls) == 2:  # the weights of epoch 2 are written, the optimizer state is not
            raise KeyboardInterrupt("killed")
        return real(tensors, path, *a, **k)

    monkeypatch.setattr(safetensors.torch, "save_file", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, images, labels, run, progress=False)
    monkeypatch.setattr(safetensors.torch, "save_file", real)
    assert json.loads((run / "progress.json").read_text())["epochs_done"] == 1
    # what a SIGKILL can leave: a half-written temporary folder and an epoch folder not yet in progress.json
    (run / ".epoch-0002.x.tmp").mkdir()
    (run / "epoch-0002").mkdir()
    (run / "epoch-0002" / "model.safetensors").write_bytes(b"half")
    model, _, prog = load_checkpoint(run)
    assert prog["epochs_done"] == 1
    done = train(cfg, images, labels, run, progress=False)
    assert done["epochs_done"] == 3 and _same(_weights(tmp_path / "full"), _weights(run))
    assert not (run / "epoch-0002").exists() and (run / "epoch-0003").is_dir()


def test_step_batches_do_not_depend_on_the_worker_count():
    from oodeval.cnc.loader import step_loader

    images, labels = _toy(n=24, size=12)
    cfg = TrainConfig.recipe("cnc-cifar", model="test_resnet", num_classes=3, in_chans=1, batch_size=8,
                             mean=(0.5,), std=(0.5,), corruptions=("contrast", "gaussian_noise", "fog"))  # fmt: skip
    runs = []
    for workers in (0, 1, 2):
        runs.append([{k: v.clone() for k, v in b.items()} for b in step_loader(images, labels, cfg, epoch=1, workers=workers)])
    assert len(runs[0]) == 3 and set(runs[0][0]) == {"x", "y", "outliers"}
    for other in runs[1:]:
        assert all(all(torch_equal(a[k], b[k]) for k in a) for a, b in zip(runs[0], other))
    # another epoch draws other batches; the ID batch is augmented (crop + flip), not the raw images
    again = list(step_loader(images, labels, cfg, epoch=2))
    assert not torch_equal(again[0]["outliers"], runs[0][0]["outliers"])
    raw = to_tensor(images[np.random.default_rng([0, 1]).permutation(24)[:8]], (0.5,), (0.5,))
    assert not torch_equal(raw, runs[0][0]["x"])


def torch_equal(a, b):
    import torch

    return bool(torch.equal(a, b))


def test_release_recipe_and_cifar_stem():
    import torch

    cfg = TrainConfig.recipe("cnc-cifar", num_classes=10)
    assert (cfg.model, cfg.batch_size, cfg.epochs, cfg.weight_decay, cfg.lr) == ("resnet34", 64, 200, 5e-4, 0.1)
    assert milestone_epochs(cfg) == [100, 150] and len(cfg.corruptions) == 15 and "motion_blur" not in cfg.corruptions
    assert (cfg.augment, cfg.outlier_augment, cfg.outlier_pairing) == ("crop_flip", "release", "shuffled")
    with pytest.raises(ValueError, match="unknown recipe"):
        TrainConfig.recipe("nope")
    # a CIFAR stem keeps 32 px at full resolution into the first stage (timm's stem would give 8 x 8)
    small = _cfg(in_chans=3, cifar_stem=True)
    m = build_model(small).eval()
    with torch.no_grad():
        assert m.forward_features(torch.zeros(1, 3, 32, 32)).shape[-1] == 4
        assert build_model(_cfg(in_chans=3)).eval().forward_features(torch.zeros(1, 3, 32, 32)).shape[-1] == 1
    with pytest.raises(ValueError, match="cifar_stem"):
        build_model(_cfg(model="test_vit", cifar_stem=True, model_kwargs={"img_size": 16, "patch_size": 8}))


def test_bad_training_data_is_rejected(tmp_path):
    images, labels = _toy(n=40)
    with pytest.raises(ValueError, match="labels outside"):
        train(_cfg(), images, labels + 1, tmp_path / "x", progress=False)
    with pytest.raises(ValueError, match="channel"):
        train(_cfg(in_chans=3), images, labels, tmp_path / "x", progress=False)


def test_cli_recipe_with_overrides_and_device_choice(tmp_path):
    from oodeval.cli import main
    from oodeval.cnc.train import resolve_device

    images, labels = _toy(n=32, size=12)
    np.savez(tmp_path / "train.npz", images=images, labels=labels)
    assert main(["cnc", "train", "--dataset", str(tmp_path / "train.npz"), "--out", str(tmp_path / "run"),
                 "--recipe", "cnc-cifar", "--model", "test_resnet", "--epochs", "1", "--batch-size", "16",
                 "--corruptions", "contrast,fog", "--device", "cpu", "--no-progress"]) == 0  # fmt: skip
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (cfg["model"], cfg["epochs"], cfg["batch_size"], cfg["corruptions"]) == ("test_resnet", 1, 16, ["contrast", "fog"])
    assert cfg["cifar_stem"] and cfg["augment"] == "crop_flip" and cfg["outlier_pairing"] == "shuffled"
    assert cfg["severity"] == "imagenet" and cfg["weight_decay"] == 5e-4 and len(cfg["mean"]) == 1  # grey input
    assert json.loads((tmp_path / "run" / "progress.json").read_text())["history"][0]["device"] == "cpu"
    assert str(resolve_device("cpu")) == "cpu"
    with pytest.raises(ValueError, match="device"):
        resolve_device("tpu")
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA"):
            resolve_device("cuda")
