"""Extraction with random-init tiny timm models on a generated image folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from oodeval.data import Manifest
from oodeval.features import FeatureSet
from oodeval.features import extract as extract_mod
from oodeval.features.extract import extract

KW = {"num_classes": 3, "pretrained_cfg_overlay": {"input_size": (3, 32, 32)}}


def _make_folder(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for c in ("cat", "dog"):
        (root / c).mkdir(parents=True)
        for i in range(5):
            Image.fromarray(rng.integers(0, 256, (36 + i, 40, 3), dtype=np.uint8)).save(root / c / f"{i}.jpg")
    good = (root / "cat" / "0.jpg").read_bytes()
    (root / "cat" / "9_truncated.jpg").write_bytes(good[: len(good) // 2])
    (root / "dog" / "9_empty.png").write_bytes(b"")
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _make_folder(tmp_path_factory.mktemp("imgs") / "pets")


def _reference(model: torch.nn.Module, paths: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Pre-logits and logits of the model's own forward on the images, preprocessed by timm."""
    from timm.data import create_transform, resolve_data_config

    tf = create_transform(**resolve_data_config({}, model=model))
    x = torch.stack([tf(Image.open(p).convert("RGB")) for p in paths])
    with torch.no_grad():
        return model.forward_head(model.forward_features(x), pre_logits=True).numpy(), model(x).numpy()


def test_saved_weights_logits_equal_model_forward_and_bad_images_are_skipped(folder: Path, tmp_path: Path) -> None:
    import timm
    from safetensors.torch import save_file

    model = timm.create_model("test_resnet", **KW).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
        for name, buf in model.named_buffers():
            if name.endswith("running_var"):
                buf.uniform_(0.5, 2.0, generator=gen)
    weights = tmp_path / "w.safetensors"
    save_file(model.state_dict(), str(weights))

    path = extract("test_resnet", folder, tmp_path / "store", weights=weights, model_kwargs=KW, batch_size=4,
                   shard_size=5, progress=False)
    fs = FeatureSet.load(path)
    assert len(fs) == 10 and fs.meta["n_skipped"] == 2
    assert sorted(Path(s["path"]).name for s in fs.meta["skipped"]) == ["9_empty.png", "9_truncated.jpg"]
    kept = Manifest.from_csv(path / "manifest.csv")
    assert kept.labels.tolist() == fs.labels.tolist() == [0] * 5 + [1] * 5
    feats, logits = _reference(model, kept.paths)
    np.testing.assert_allclose(fs.features, feats, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fs.logits, logits, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(fs.weight, model.fc.weight.detach().numpy())
    np.testing.assert_array_equal(fs.bias, model.fc.bias.detach().numpy())
    assert fs.meta["preprocessing"]["data_config"]["input_size"] == [3, 32, 32]

    ckpt = tmp_path / "w.pth"  # a torch checkpoint with a wrapper dict and a DDP prefix, read weights_only
    torch.save({"state_dict": {f"module.{k}": v for k, v in model.state_dict().items()}, "epoch": 3}, ckpt)
    fs2 = FeatureSet.load(extract("test_resnet", folder, tmp_path / "store", weights=ckpt, model_kwargs=KW, progress=False))
    np.testing.assert_allclose(fs2.logits, fs.logits, rtol=1e-5, atol=1e-6)

    bad = tmp_path / "bad.safetensors"
    save_file({k: v for k, v in model.state_dict().items() if not k.startswith("fc.")}, str(bad))
    with pytest.raises(ValueError, match="2 missing keys"):
        extract("test_resnet", folder, tmp_path / "store", weights=bad, model_kwargs=KW, progress=False)


def test_repeat_is_a_cached_no_op_and_options_change_the_key(folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = extract("test_resnet", folder, tmp_path, model_kwargs=KW, progress=False)
    stamp = (first / "meta.json").stat().st_mtime_ns

    def boom(*a, **k):
        raise AssertionError("a cached entry must not load the model")

    monkeypatch.setattr(extract_mod, "load_backbone", boom)
    assert extract("test_resnet", folder, tmp_path, model_kwargs=KW, batch_size=7, progress=False) == first
    assert (first / "meta.json").stat().st_mtime_ns == stamp
    with pytest.raises(AssertionError, match="must not load"):
        extract("test_resnet", folder, tmp_path, model_kwargs={**KW, "num_classes": 4}, progress=False)
    assert not list((tmp_path / ".partial").glob("*/shard-*"))


def test_taps_store_nac_states_in_the_same_pass(folder: Path, tmp_path: Path) -> None:
    from oodeval.features.taps import default_nac_layers

    plain = FeatureSet.load(extract("test_resnet", folder, tmp_path, model_kwargs=KW, progress=False))
    tapped = FeatureSet.load(extract("test_resnet", folder, tmp_path, model_kwargs=KW, taps=True, progress=False))
    import timm

    layers = default_nac_layers(timm.create_model("test_resnet", **KW))
    assert sorted(tapped.extras_with_prefix("nac/")) == sorted(f"nac/{n}" for n in layers)
    assert tapped.extras["nac/pre_logits"].shape == (10, plain.features.shape[1])
    np.testing.assert_allclose(tapped.features, plain.features, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tapped.logits, plain.logits, rtol=1e-5, atol=1e-6)
    tapped.require(("extra:nac/*",))


def test_vit_and_greyscale_model(folder: Path, tmp_path: Path) -> None:
    fs = FeatureSet.load(extract("timm:test_vit", folder, tmp_path, model_kwargs=KW, batch_size=16, progress=False))
    assert fs.features.shape == (10, fs.weight.shape[1]) and fs.logits.shape == (10, 3)
    np.testing.assert_allclose(fs.logits, fs.features @ fs.weight.T + fs.bias, rtol=1e-4, atol=1e-4)
    headless = FeatureSet.load(extract("test_vit", folder, tmp_path, model_kwargs={**KW, "num_classes": 0}, progress=False))
    assert headless.logits is None and not headless.has_head
    assert headless.features.shape == fs.features.shape

    grey = {"num_classes": 2, "in_chans": 1,
            "pretrained_cfg_overlay": {"input_size": (1, 28, 28), "mean": (0.5,), "std": (0.25,), "crop_pct": 1.0,
                                       "interpolation": "bilinear"}}
    rng = np.random.default_rng(3)
    paths = []
    for i in range(3):
        p = tmp_path / f"g{i}.png"
        Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8)).save(p)
        paths.append(str(p))
    (tmp_path / "empty.png").write_bytes(b"")
    paths.insert(1, str(tmp_path / "empty.png"))
    m = Manifest(paths, np.array([0, 1, 1, 0]), name="grey", split=["a", "b", "c", "d"], fine_grained=[1, 0, 0, 1])
    out = FeatureSet.load(extract("test_resnet", m, tmp_path, model_kwargs=grey, progress=False))
    assert out.meta["image_mode"] == "L" and out.logits.shape == (3, 2)
    assert out.extras["manifest_index"].tolist() == [0, 2, 3] and out.labels.tolist() == [0, 1, 0]
    assert out.extras["split"].tolist() == ["a", "c", "d"] and out.extras["fine_grained"].tolist() == [True, False, True]


def test_probe_head_attached_to_extraction(folder: Path, tmp_path: Path) -> None:
    from oodeval.features.probe import probe_accuracy, save_probe, train_probe

    rng = np.random.default_rng(0)
    centres = rng.normal(0, 3, (3, 8)).astype(np.float32)
    y = rng.integers(0, 3, 300)
    train = FeatureSet(features=centres[y] + rng.normal(0, 1, (300, 8)).astype(np.float32), labels=y)
    w, b, losses = train_probe(train, epochs=30, batch_size=64, lr=0.05, seed=0)
    assert losses[-1] < 0.5 * losses[0] and probe_accuracy(train, w, b) > 0.9
    w2, b2, _ = train_probe(train, epochs=30, batch_size=64, lr=0.05, seed=0)
    assert np.array_equal(w, w2) and np.array_equal(b, b2)

    base = FeatureSet.load(extract("test_resnet", folder, tmp_path, model_kwargs=KW, progress=False))
    hw = rng.normal(0, 1, (5, base.features.shape[1])).astype(np.float32)
    hb = rng.normal(0, 1, 5).astype(np.float32)
    head = save_probe(tmp_path / "head.safetensors", hw, hb, {"note": "test"})
    probed = FeatureSet.load(extract("test_resnet", folder, tmp_path, model_kwargs=KW, head=head, progress=False))
    np.testing.assert_array_equal(probed.weight, hw)
    np.testing.assert_allclose(probed.features, base.features, rtol=1e-6)
    np.testing.assert_allclose(probed.logits, base.features @ hw.T + hb, rtol=1e-4, atol=1e-4)


def test_split_preprocessing_is_bit_identical_to_the_model_transform(folder: Path) -> None:
    from oodeval.features.backbones import load_backbone
    from oodeval.features.preprocess import split_transform

    for name, kw, mode in (("resnet18", {}, "RGB"), ("test_resnet", {"in_chans": 1, "pretrained_cfg_overlay": {
            "input_size": (1, 28, 28), "mean": (0.3,), "std": (0.2,), "crop_pct": 0.9}}, "L")):
        bb = load_backbone(name, model_kwargs=kw)
        split = split_transform(bb.transform)
        assert split is not None
        imgs = [Image.open(p).convert(mode) for p in sorted((folder / "dog").glob("[0-4].jpg"))]
        whole = torch.stack([bb.transform(im) for im in imgs])
        batched = split.finish(torch.from_numpy(np.stack([split(im) for im in imgs])), channels_last=True)
        assert torch.equal(whole, batched)
    assert split_transform(lambda im: im) is None


def test_cli_extract_probe_and_errors(folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import json

    from oodeval.cli import main

    kw = json.dumps({"num_classes": 2, "pretrained_cfg_overlay": {"input_size": [3, 32, 32]}})
    args = ["extract", "--model", "test_resnet", "--pretrained", "none", "--dataset", str(folder), "--store", str(tmp_path / "s"),
            "--model-kwargs", kw, "--no-progress"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    entry = Path(out.splitlines()[0])
    assert "2 unreadable images skipped" in out and FeatureSet.load(entry).logits.shape == (10, 2)
    assert main(["probe", "--train", str(entry), "--out", str(tmp_path / "h.safetensors"), "--epochs", "3"]) == 0
    assert "train accuracy" in capsys.readouterr().out
    assert main([*args, "--head", str(tmp_path / "h.safetensors")]) == 0
    probed = FeatureSet.load(capsys.readouterr().out.splitlines()[0])
    assert probed.meta["head"].endswith("h.safetensors") and probed.weight.shape == (2, probed.features.shape[1])
    assert main(["extract", "--model", "test_resnet", "--pretrained", "none", "--dataset", "no-such-set", "--store", str(tmp_path)]) == 2
    assert "unknown dataset 'no-such-set'" in capsys.readouterr().err


def test_corrupt_weights_file_is_a_clear_error_not_a_traceback(folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from oodeval.cli import main

    bad = tmp_path / "w.safetensors"
    bad.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")
    args = ["extract", "--model", "test_resnet", "--dataset", str(folder), "--store", str(tmp_path / "s"), "--weights", str(bad), "--no-progress"]
    assert main(args) == 2
    assert f"{bad} is not a readable safetensors file" in capsys.readouterr().err


def test_a_manifest_row_whose_file_is_missing_is_an_error_unless_skipped(folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from oodeval.cli import main

    csv = tmp_path / "m.csv"
    rows = [f"{folder / 'cat' / f'{i}.jpg'},0" for i in range(3)] + [f"{tmp_path / 'gone.jpg'},1"]
    csv.write_text("path,label\n" + "\n".join(rows) + "\n")
    args = ["extract", "--model", "test_resnet", "--pretrained", "none", "--dataset", str(csv), "--store", str(tmp_path / "s"),
            "--model-kwargs", '{"num_classes": 2}', "--no-progress"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"1 of 4 files in the manifest do not exist (e.g. {tmp_path / 'gone.jpg'})" in err and "--skip-missing" in err
    assert not (tmp_path / "s").exists() or not list((tmp_path / "s").rglob("meta.json"))
    assert main([*args, "--skip-missing"]) == 0
    fs = FeatureSet.load(capsys.readouterr().out.splitlines()[0])
    assert len(fs) == 3 and fs.meta["n_skipped"] == 1 and "gone.jpg" in json.dumps(fs.meta["skipped"])
