"""OpenOOD's data as it lies: image lists read directly, a generated OpenOOD-layout root run as the
cifar10 benchmark through the experiment grid with a random-init ResNet, near/far groups kept."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from oodeval.data import resolve
from oodeval.data.openood import BENCHMARKS, experiment_datasets, read_imglist

COLOURS = [(200, 40, 40), (40, 200, 40), (40, 40, 200)]


def _image(path, rgb, rng) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    a = np.clip(np.array(rgb) + rng.normal(0, 30, (20, 20, 3)), 0, 255).astype(np.uint8)
    Image.fromarray(a).save(path)


def make_openood_root(root) -> None:
    """images_classic/<dataset>/... and benchmark_imglist/cifar10/*.txt, as OpenOOD's download lays them."""
    rng = np.random.default_rng(0)
    lists = root / "benchmark_imglist" / "cifar10"
    lists.mkdir(parents=True)
    for split, n in (("train", 5), ("test", 4)):
        lines = []
        for c, rgb in enumerate(COLOURS):
            for i in range(n):
                rel = f"cifar10/{split}/{c}_{i}.png"
                _image(root / "images_classic" / rel, rgb, rng)
                lines.append(f"{rel} {c}")
        (lists / f"{split}_cifar10.txt").write_text("\n".join(lines) + "\n")
    for group in ("near", "far"):
        for k, (name, file) in enumerate(BENCHMARKS["cifar10"][group].items()):
            lines = []
            for i in range(4):
                rel = f"{name}/test/{i}.png"
                _image(root / "images_classic" / rel, (60 * k, 128, 90 if group == "near" else 250), rng)
                lines.append(f"{rel} 0")  # OpenOOD's OOD lists carry a placeholder label
            (lists / file).write_text("\n".join(lines) + "\n")


def test_image_lists_read_as_manifests(tmp_path):
    make_openood_root(tmp_path)
    lists = tmp_path / "benchmark_imglist" / "cifar10"
    train = resolve(lists / "train_cifar10.txt")
    assert len(train) == 15 and list(np.bincount(train.labels)) == [5, 5, 5]
    assert train.root == tmp_path / "images_classic" and not train.missing_files()
    svhn = read_imglist(lists / "test_svhn.txt")
    assert (svhn.labels == -1).all() and svhn.name == "cifar10/test_svhn"
    (lists / "test_bad.txt").write_text("svhn/test/0.png 0\nsvhn/test/1.png\n")
    with pytest.raises(ValueError, match="test_bad.txt line 2: expected '<path> <integer label>'"):
        read_imglist(lists / "test_bad.txt")
    (lists / "test_gone.txt").write_text("nowhere/0.png 0\n")
    with pytest.raises(FileNotFoundError, match="first image nowhere/0.png is under none of"):
        read_imglist(lists / "test_gone.txt")


def test_an_openood_root_runs_as_the_cifar10_benchmark_with_near_and_far(tmp_path):
    from oodeval.experiment import load_config, run_experiment
    from oodeval.results import load_results

    make_openood_root(tmp_path / "openood")
    exp = {
        "seeds": [0], "bootstrap_draws": 20, "batch_size": 16, "device": "cpu",
        "datasets": experiment_datasets(tmp_path / "openood", "cifar10"),
        "models": [{"name": "timm:test_resnet", "label": "r", "pretrained": False, "model_kwargs": {"num_classes": 3}}],
        "detectors": ["msp", "ebo", "OpenMax", "she", "gradnorm", "ash"],
    }  # fmt: skip
    cfg = load_config(exp, base_dir=tmp_path)
    summary = run_experiment(cfg, progress=False)
    df = load_results(summary.results)
    assert (df["status"] == "ok").all(), df["error"].dropna().tolist()
    assert set(df["detector"]) == {"msp", "energy", "openmax", "she", "gradnorm", "ash_b"}
    assert set(df["dataset"]) == {"cifar100", "tin", "mnist", "svhn", "texture", "places365"}
    assert (df["n_id"] == 12).all() and (df["n_ood"] == 4).all()
    from oodeval.report import write_report

    out = write_report(summary, tmp_path / "report", experiment=cfg, convention="openood", formats=())
    text = out["markdown"].read_text()
    assert "**Mean (near)**" in text and "**Mean (far)**" in text  # OpenOOD's two groups, each averaged
    assert "FPR@95 OOD-pos" in text  # its OOD-positive FPR@95 beside the paper's
