"""K+1 training: the head, ID prediction over the first K, a falling loss, checkpoints, resume."""

import json

import numpy as np
import pytest

from oodeval.cnc.train import (
    CnCTrainConfig, build_model, extract_in_memory, id_predictions, load_checkpoint, lr_at, milestone_epochs, to_tensor, train,
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
    return CnCTrainConfig(**base)


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
    fs = extract_in_memory(build_model(vit), _toy(n=4)[0], vit)
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
    assert CnCTrainConfig.from_json(json.loads(json.dumps(cfg.to_json()))) == cfg


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
    assert cfg == _cfg(epochs=4, image_size=(16, 16), data_hash=cfg.data_hash, frost=cfg.frost, device="cpu", precision="fp32")
    fs = extract_in_memory(model, images[:10], cfg, labels[:10])
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


@pytest.mark.numerics
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
    assert not (run / ".epoch-0002.x.tmp").exists()  # the staging folder of the killed write is removed


def test_step_batches_do_not_depend_on_the_worker_count():
    from oodeval.cnc.loader import step_loader

    images, labels = _toy(n=24, size=12)
    cfg = CnCTrainConfig.recipe("cnc-cifar", model="test_resnet", num_classes=3, in_chans=1, batch_size=8,
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

    cfg = CnCTrainConfig.recipe("cnc-cifar", num_classes=10)
    assert (cfg.model, cfg.batch_size, cfg.epochs, cfg.weight_decay, cfg.lr) == ("resnet34", 64, 200, 5e-4, 0.1)
    assert milestone_epochs(cfg) == [100, 150] and len(cfg.corruptions) == 15 and "motion_blur" not in cfg.corruptions
    assert (cfg.augment, cfg.outlier_augment, cfg.outlier_pairing) == ("crop_flip", "release", "shuffled")
    with pytest.raises(ValueError, match="unknown recipe"):
        CnCTrainConfig.recipe("nope")
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
    from oodeval._device import resolve_device

    images, labels = _toy(n=32, size=12)
    np.savez(tmp_path / "train.npz", images=images, labels=labels)
    assert main(["cnc", "train", "--dataset", str(tmp_path / "train.npz"), "--out", str(tmp_path / "run"),
                 "--recipe", "cnc-cifar", "--model", "test_resnet", "--epochs", "1", "--batch-size", "16",
                 "--corruptions", "contrast,fog", "--device", "cpu", "--no-progress"]) == 0  # fmt: skip
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (cfg["model"], cfg["epochs"], cfg["batch_size"], cfg["corruptions"]) == ("test_resnet", 1, 16, ["contrast", "fog"])
    assert cfg["cifar_stem"] and cfg["augment"] == "crop_flip" and cfg["outlier_pairing"] == "shuffled"
    assert cfg["severity"] == "imagecorruptions" and cfg["weight_decay"] == 5e-4 and len(cfg["mean"]) == 1  # grey input
    assert json.loads((tmp_path / "run" / "progress.json").read_text())["history"][0]["device"] == "cpu"
    assert str(resolve_device("cpu")) == "cpu"
    with pytest.raises(ValueError, match="device"):
        resolve_device("tpu")
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA"):
            resolve_device("cuda")


def test_a_kill_in_the_first_checkpoint_write_then_other_settings_is_refused(tmp_path, monkeypatch):
    import safetensors.torch

    images, labels = _toy(n=32)
    cfg = _cfg(epochs=1, batch_size=16)
    real = safetensors.torch.save_file

    def killed(*a, **k):
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(safetensors.torch, "save_file", killed)
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        train(cfg, images, labels, run, progress=False)
    monkeypatch.setattr(safetensors.torch, "save_file", real)
    # the state a SIGKILL inside the first write leaves: config.json, no progress.json, a staging folder
    assert (run / "config.json").is_file() and not (run / "progress.json").exists()
    (run / ".epoch-0001.k1ll.tmp" / "payload").mkdir(parents=True)
    (run / ".epoch-0001.k1ll.tmp" / "payload" / "model.safetensors").write_bytes(b"half")
    with pytest.raises(ValueError, match=r"killed before its first epoch ended with other settings: lr \(0.05"):
        train(_cfg(epochs=1, batch_size=16, lr=0.01), images, labels, run, progress=False)
    assert json.loads((run / "config.json").read_text())["lr"] == 0.05
    # the same settings go on; the leftovers are removed and the run equals an uninterrupted one
    train(cfg, images, labels, run, progress=False)
    train(cfg, images, labels, tmp_path / "clean", progress=False)
    assert sorted(p.name for p in run.iterdir()) == [".oodeval-output.jsonl", "config.json", "epoch-0001", "progress.json"]
    assert _same(_weights(run), _weights(tmp_path / "clean"))


def test_unreadable_checkpoint_files_are_named(tmp_path, capsys):
    from oodeval.cli import main

    images, labels = _toy(n=32, size=12)
    np.savez(tmp_path / "train.npz", images=images, labels=labels)
    run = tmp_path / "run"
    args = ["cnc", "train", "--dataset", str(tmp_path / "train.npz"), "--out", str(run), "--model", "test_resnet",
            "--epochs", "2", "--batch-size", "16", "--corruptions", "contrast", "--no-progress"]  # fmt: skip
    train(_cfg(epochs=2, batch_size=16, lr=0.1, corruptions=("contrast",)), images, labels, run, progress=False, stop_after=1)
    for name in ("optimizer.safetensors", "model.safetensors"):
        f = run / "epoch-0001" / name
        f.write_bytes(f.read_bytes()[:100])
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and f"{f}: unreadable checkpoint file" in err, err
    with pytest.raises(ValueError, match="model.safetensors: unreadable checkpoint file"):
        load_checkpoint(run)
    assert main(["cnc", "evaluate", "--checkpoint", str(run), "--id-test", str(tmp_path / "train.npz"),
                 "--ood", str(tmp_path / "train.npz"), "--no-progress"]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "model.safetensors: unreadable checkpoint file" in err, err
    (run / "progress.json").write_text("{")
    assert main(args) == 2 and f"{run / 'progress.json'}: unreadable progress record" in capsys.readouterr().err


def test_cnc_train_skips_and_lists_unreadable_images(tmp_path, capsys):
    from PIL import Image

    from oodeval.cli import main

    images, labels = _toy(n=36, size=12)
    for i, (im, y) in enumerate(zip(images, labels)):
        (tmp_path / "data" / f"c{y}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(im).save(tmp_path / "data" / f"c{y}" / f"{i:02d}.png")
    bad = tmp_path / "data" / "c1" / "99.png"
    bad.write_bytes((tmp_path / "data" / "c1" / "01.png").read_bytes()[:30])
    assert main(["cnc", "train", "--dataset", str(tmp_path / "data"), "--out", str(tmp_path / "run"), "--model",
                 "test_resnet", "--epochs", "1", "--batch-size", "16", "--corruptions", "contrast", "--no-progress"]) == 0  # fmt: skip
    out = capsys.readouterr()
    assert "1 unreadable image(s) skipped" in out.err and str(bad) in out.err
    assert "on 36 images" in out.out


def test_recipe_without_model_names_the_recipe_model(tmp_path, capsys):
    from oodeval.cli import main

    images, labels = _toy(n=20, size=12)
    np.savez(tmp_path / "few.npz", images=images, labels=labels)
    assert main(["cnc", "train", "--dataset", str(tmp_path / "few.npz"), "--out", str(tmp_path / "run"),
                 "--recipe", "cnc-cifar", "--no-progress"]) == 2  # fmt: skip
    out = capsys.readouterr()
    assert "training CnC (K+1) resnet34 on 20 images" in out.out and "None" not in out.out
    assert "fewer than one batch of 64" in out.err


def test_precision_choice_is_recorded_and_never_mixed(tmp_path, monkeypatch):
    import torch

    from oodeval.cnc import train as tr
    from oodeval.cnc.evaluate import comparable

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert tr.resolve_precision(cpu) == "fp32" and tr.resolve_precision(cpu, "bf16") == "bf16"
    with pytest.raises(ValueError, match="fp16 needs a CUDA device"):
        tr.resolve_precision(cpu, "fp16")
    monkeypatch.setattr(tr, "_native_bf16", lambda dev: True)  # an A100 / H100
    assert tr.resolve_precision(cuda) == "bf16"
    monkeypatch.setattr(tr, "_native_bf16", lambda dev: False)  # a V100 / T4: bf16 only emulated
    assert tr.resolve_precision(cuda) == "fp16" and tr.resolve_precision(cuda, "fp32") == "fp32"
    with pytest.raises(ValueError, match="emulates bf16"):
        tr.resolve_precision(cuda, "bf16")
    assert not tr._scaler("bf16").is_enabled() and not tr._scaler("fp32").is_enabled()

    images, labels = _toy(n=32, size=12)
    cfg = _cfg(epochs=2, batch_size=16, corruptions=("contrast",))
    prog = train(cfg, images, labels, tmp_path / "bf", progress=False, stop_after=1, precision="bf16")
    assert prog["history"][0]["precision"] == "bf16" and prog["history"][0]["device"] == "cpu"
    _, bf_cfg, _ = load_checkpoint(tmp_path / "bf")
    assert (bf_cfg.device, bf_cfg.precision) == ("cpu", "bf16")
    with pytest.raises(ValueError, match=r"precision \('bf16' in the checkpoint, 'fp32' now\)"):
        train(cfg, images, labels, tmp_path / "bf", progress=False)
    train(cfg, images, labels, tmp_path / "fp", progress=False, stop_after=1)
    # a run of the previous version (no device / precision in config.json, "cpu" in its history)
    # is read as cpu / fp32, resumes as such and is not mixed with a bf16 run
    legacy = json.loads((tmp_path / "fp" / "config.json").read_text())
    del legacy["device"], legacy["precision"]
    (tmp_path / "fp" / "config.json").write_text(json.dumps(legacy))
    _, fp_cfg, _ = load_checkpoint(tmp_path / "fp")
    assert (fp_cfg.device, fp_cfg.precision) == ("cpu", "fp32")
    with pytest.raises(ValueError, match="precision: 'fp32' vs 'bf16'"):
        comparable([fp_cfg, bf_cfg], ["fp", "bf"])
    with pytest.raises(ValueError, match=r"precision \('fp32' in the checkpoint, 'bf16' now\)"):
        train(cfg, images, labels, tmp_path / "fp", progress=False, precision="bf16")
    assert train(cfg, images, labels, tmp_path / "fp", progress=False)["epochs_done"] == 2
    fs = extract_in_memory(build_model(bf_cfg), images[:4], bf_cfg, precision="bf16")
    assert (fs.meta["device"], fs.meta["precision"]) == ("cpu", "bf16")


def test_no_host_sync_per_training_step(tmp_path, monkeypatch):
    """Reading a tensor on the host (item, tolist, int/float/bool) per step would stall a GPU; the
    count of such reads in one epoch must not grow with its number of steps."""
    import torch

    counts = {"n": 0}
    for name in ("item", "tolist", "__int__", "__float__", "__bool__"):
        real = getattr(torch.Tensor, name)

        def counted(self, *a, _real=real, **k):
            counts["n"] += 1
            return _real(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    per_epoch = []
    for n in (32, 64):  # 2 and 4 steps of 16
        images, labels = _toy(n=n, size=12)
        counts["n"] = 0
        train(_cfg(epochs=1, batch_size=16, corruptions=("contrast",)), images, labels, tmp_path / f"r{n}", progress=False)
        per_epoch.append(counts["n"])
    assert per_epoch[0] == per_epoch[1], per_epoch
