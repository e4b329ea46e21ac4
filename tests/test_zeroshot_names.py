"""Class names and model identity on the zero-shot side (issue 14 item 5): ``imagenet1k`` wherever ID names
are asked for, wnids never prompt text, no silent ImageNet default, text tower = image tower."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from oodeval.cli import main
from oodeval.features import FeatureSet
from oodeval.zeroshot.build import prompt_names, read_id_names
from oodeval.zeroshot.imagenet import class_names, wnids


def test_wnids_are_mapped_to_names_or_refused(tmp_path: Path) -> None:
    assert prompt_names(["n01440764", "n04008634"], "x") == ["tench", "projectile"]
    assert prompt_names(["cat", "dog"], "x") == ["cat", "dog"]
    with pytest.raises(ValueError, match="not in ImageNet-1k"):
        prompt_names(["n01440764", "n99999999"], "x")
    with pytest.raises(ValueError, match="mix 1 WordNet ids"):
        prompt_names(["n01440764", "cat"], "x")
    (tmp_path / "ids.txt").write_text("\n".join(wnids()[:3]) + "\n")
    assert read_id_names(str(tmp_path / "ids.txt"))[0] == list(class_names()[:3])


def test_grid_id_classes_imagenet1k_is_a_name_not_a_path(tmp_path: Path) -> None:
    from oodeval.experiment import load_config
    from oodeval.experiment.zeroshot import _class_names

    cfg = load_config({"datasets": {"id_test": "val", "ood": ["x"], "id_classes": "imagenet1k"},
                       "models": [{"name": "open_clip:ViT-B-32", "kind": "zero-shot", "pretrained": False}]}, base_dir=tmp_path)
    assert str(cfg.id_classes) == "imagenet1k"
    names = _class_names(cfg)
    assert len(names) == 1000 and names[0] == "tench" and not any(n.startswith("n0") and n[1:].isdigit() for n in names)


@pytest.fixture(scope="module")
def clip_features(tiny_clip: str, tmp_path_factory) -> dict[str, Path]:
    """Tiny random-init CLIP (seed 0) features of an ImageNet-style folder (class folders named by wnid)."""
    from oodeval.features.extract import extract

    root = tmp_path_factory.mktemp("zsnames")
    rng = np.random.default_rng(0)
    for split, n in (("id", 6), ("ood", 4)):
        for i in range(n):
            folder = root / split / (wnids()[i % 2] if split == "id" else "novel")
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (36, 36, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    return {s: extract(f"open_clip:{tiny_clip}", root / s, root / "store", progress=False) for s in ("id", "ood")}


def _cli(tiny_clip: str, feats: dict, tmp_path: Path, *extra: str) -> list[str]:
    return ["zeroshot", "--model", tiny_clip, "--id-features", str(feats["id"]), "--ood-features", str(feats["ood"]),
            "--cache", str(tmp_path / "cache"), "--scorers", "mcm", *extra]


def test_zeroshot_cli_names_from_features_and_same_model_check(tiny_clip: str, clip_features: dict, tmp_path: Path, capsys) -> None:
    fs = FeatureSet.load(clip_features["id"])
    assert fs.meta["class_names"] == list(wnids()[:2]) and len(fs.meta["text_tower"]) == 32
    assert main(_cli(tiny_clip, clip_features, tmp_path, "--pretrained", "none")) == 0
    out = capsys.readouterr().out
    assert "ID names: 2 recorded with" in out
    # another random init (seed 1) is another model: refused before any label is encoded
    assert main(_cli(tiny_clip, clip_features, tmp_path / "other", "--pretrained", "none", "--seed", "1")) == 2
    err = capsys.readouterr().err
    assert "text tower differs" in err and "oodeval zeroshot: error:" in err
    assert not (tmp_path / "other" / "cache").exists() or not any((tmp_path / "other" / "cache").rglob("*.npy"))


def test_zeroshot_cli_without_recorded_names_asks_for_them(tiny_clip: str, tmp_path: Path, capsys) -> None:
    rng = np.random.default_rng(1)
    for name in ("id", "ood"):
        x = rng.normal(size=(5, 32)).astype(np.float32)
        FeatureSet(features=x / np.linalg.norm(x, axis=1, keepdims=True)).save(tmp_path / name)
    feats = {"id": tmp_path / "id", "ood": tmp_path / "ood"}
    assert main(_cli(tiny_clip, feats, tmp_path, "--pretrained", "none")) == 2
    assert "records no class names: pass --id-names" in capsys.readouterr().err
    (tmp_path / "names.txt").write_text("cat\ndog\n")
    assert main(_cli(tiny_clip, feats, tmp_path, "--pretrained", "none", "--id-names", str(tmp_path / "names.txt"))) == 0
    assert "ID names: 2 from" in capsys.readouterr().out


def test_grid_text_side_checks_the_image_features_model(tiny_clip: str, clip_features: dict, tmp_path: Path) -> None:
    from oodeval.experiment import load_config
    from oodeval.experiment.zeroshot import build_context

    (tmp_path / "names.txt").write_text("cat\ndog\n")
    cfg = load_config({"datasets": {"id_test": "val", "ood": ["x"], "id_classes": "names.txt"}, "store": "store",
                       "models": [{"name": f"open_clip:{tiny_clip}", "kind": "zero-shot", "pretrained": False}]}, base_dir=tmp_path)
    fs = FeatureSet.load(clip_features["id"])
    assert build_context(cfg.models[0], None, cfg, {"id_test": fs})["id_text"].shape == (2, 32)
    fs.meta["text_tower"] = "0" * 32  # features made by another model
    with pytest.raises(ValueError, match="text tower differs"):
        build_context(cfg.models[0], None, cfg, {"id_test": fs})
