"""OpenOOD's data as it lies: image lists read directly, a generated OpenOOD-layout root run as the
cifar10 benchmark through the experiment grid with a random-init ResNet, near/far groups kept."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from oodeval.data import resolve
from oodeval.data.openood import BENCHMARKS, experiment_datasets, read_imglist

COLOURS = [(200, 40, 40), (40, 200, 40), (40, 40, 200)]


def _image(path, rgb, rng, size: int = 32) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    a = np.clip(np.array(rgb) + rng.normal(0, 30, (size, size, 3)), 0, 255).astype(np.uint8)
    Image.fromarray(a).save(path)


def _folder(benchmark: str, dataset: str) -> str:
    """Where OpenOOD's download puts a dataset's images (evaluation_api/datasets.py, dir_dict): CIFAR-scale
    sets and Textures under images_classic, ImageNet-scale sets under images_largescale."""
    return "images_classic" if benchmark.startswith("cifar") or dataset == "textures" else "images_largescale"


def make_openood_root(root, benchmark: str = "cifar10", n_train: int = 5, n_test: int = 4, n_ood: int = 4) -> None:
    """images_classic/ + images_largescale/ and benchmark_imglist/<benchmark>/*.txt, as OpenOOD's download
    lays them: 32x32 PNGs, 3 ID classes, ``n_ood`` images per OOD list (near and far)."""
    rng = np.random.default_rng(0)
    spec = BENCHMARKS[benchmark]
    lists = root / "benchmark_imglist" / benchmark
    lists.mkdir(parents=True)
    id_dir = "cifar10" if benchmark.startswith("cifar") else "imagenet_1k"
    for split, n in (("train", n_train), ("test", n_test)):
        lines = []
        for c, rgb in enumerate(COLOURS):
            for i in range(n):
                rel = f"{id_dir}/{split}/{c}_{i}.png"
                _image(root / _folder(benchmark, benchmark) / rel, rgb, rng)
                lines.append(f"{rel} {c}")
        (lists / spec[f"id_{split}"]).write_text("\n".join(lines) + "\n")
    for group in ("near", "far"):
        for k, (name, file) in enumerate(spec[group].items()):
            lines = []
            for i in range(n_ood):
                rel = f"{name}/test/{i}.png"
                _image(root / _folder(benchmark, name) / rel, (60 * k, 128, 90 if group == "near" else 250), rng)
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


#: OpenOOD v1.5's ImageNet list files (openood/evaluation_api/datasets.py, DATA_INFO), written out here
RELEASE_LISTS = {
    "imagenet200": ("train_imagenet200.txt", "test_imagenet200.txt"),
    "imagenet": ("train_imagenet.txt", "test_imagenet.txt"),
}
RELEASE_NEAR = {"ssb_hard": "test_ssb_hard.txt", "ninco": "test_ninco.txt"}
RELEASE_FAR = {"inaturalist": "test_inaturalist.txt", "textures": "test_textures.txt", "openimage_o": "test_openimage_o.txt"}


@pytest.mark.parametrize("benchmark", ["imagenet200", "imagenet"])
def test_the_imagenet_benchmarks_read_their_lists_as_openood_lays_them(tmp_path, benchmark):
    make_openood_root(tmp_path, benchmark, n_train=1, n_test=2, n_ood=2)
    table = experiment_datasets(tmp_path, benchmark)
    lists = tmp_path / "benchmark_imglist" / benchmark
    assert (table["id_train"], table["id_test"]) == tuple(str(lists / f) for f in RELEASE_LISTS[benchmark])
    assert [(d["label"], d["group"], d["name"]) for d in table["ood"]] == (
        [(n, "near", str(lists / f)) for n, f in RELEASE_NEAR.items()] + [(n, "far", str(lists / f)) for n, f in RELEASE_FAR.items()])
    test = resolve(table["id_test"])
    assert list(test.labels) == [0, 0, 1, 1, 2, 2] and test.root == tmp_path / "images_largescale" and not test.missing_files()
    for d in table["ood"]:
        m = resolve(d["name"])
        # Textures lies under images_classic in OpenOOD's download, every other ImageNet-scale set under images_largescale
        assert m.root == tmp_path / ("images_classic" if d["label"] == "textures" else "images_largescale"), d["label"]
        assert (m.labels == -1).all() and len(m) == 2 and not m.missing_files()


def _experiment(tmp_path, root, benchmark: str = "cifar10", detectors=("msp", "ebo", "react", "she", "ash")) -> Path:
    exp = tmp_path / "exp.toml"
    exp.write_text(f"""
seeds = [0]
bootstrap_draws = 20
batch_size = 64
device = "cpu"
detectors = {list(detectors)!r}
[openood]
benchmark = "{benchmark}"
root = "{root}"
[[models]]
name = "openood:resnet18_32x32"
label = "ResNet18_32x32"
pretrained = false
""")
    return exp


def test_a_missing_list_or_benchmark_is_a_clear_error(tmp_path, capsys):
    from oodeval import cli
    from oodeval.experiment import load_config

    make_openood_root(tmp_path / "openood", n_train=1, n_test=1, n_ood=1)
    lists = tmp_path / "openood" / "benchmark_imglist" / "cifar10"
    (lists / "test_tin.txt").unlink()
    (lists / "test_svhn.txt").unlink()
    exp = _experiment(tmp_path, tmp_path / "openood")
    with pytest.raises(FileNotFoundError, match=r"2 image list\(s\) missing: .*cifar10/test_tin.txt, .*cifar10/test_svhn.txt; "
                                                r"expected <root>/benchmark_imglist/<benchmark>/<split>_<dataset>.txt"):
        load_config(exp)
    assert cli.main(["run", str(exp), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("oodeval run: error: OpenOOD benchmark 'cifar10' under ") and "test_tin.txt" in err and err.count("\n") == 1
    with pytest.raises(FileNotFoundError, match=r"benchmark_imglist/imagenet200 does not exist; expected <root>/benchmark_imglist"):
        load_config(_experiment(tmp_path, tmp_path / "openood", "imagenet200"))
    with pytest.raises(ValueError, match=r"\[openood\]: unknown OpenOOD benchmark 'cifar11'; known: cifar10, cifar100, imagenet200, imagenet"):
        load_config(_experiment(tmp_path, tmp_path / "openood", "cifar11"))
    exp.write_text(exp.read_text() + '[datasets]\nid_test = "x"\nood = ["y"]\n')
    with pytest.raises(ValueError, match=r"give \[openood\] .* or \[datasets\], not both"):
        load_config(exp)


def test_oodeval_run_takes_an_openood_root_as_the_cifar10_benchmark_with_resnet18_32x32(tmp_path):
    """`oodeval run` on an [openood] experiment: ID train/test and the six OOD lists of OpenOOD v1.5's
    cifar10 benchmark, OpenOOD's random-init ResNet18_32x32, and the report's near / far means per
    detector equal to the plain means of the results table's per-set values, in both FPR@95 conventions."""
    from oodeval import cli
    from oodeval.results import load_results

    make_openood_root(tmp_path / "openood", n_train=3, n_test=3, n_ood=2)  # 30 images: ResNet-18's convolutions dominate
    exp = _experiment(tmp_path, tmp_path / "openood")
    assert cli.main(["run", str(exp), "--no-progress"]) == 0
    df = load_results(tmp_path / "results.parquet")
    assert (df["status"] == "ok").all(), df["error"].dropna().tolist()
    assert set(df["dataset"]) == {"cifar100", "tin", "mnist", "svhn", "texture", "places365"}
    assert set(df["detector"]) == {"msp", "energy", "react", "she", "ash_b"}
    assert (df["n_id"] == 9).all() and (df["n_ood"] == 2).all() and (df["model"] == "ResNet18_32x32").all()
    from oodeval.report import write_report

    text = write_report(tmp_path / "results.parquet", tmp_path / "report", experiment=exp, convention="openood", formats=(), draws=50)["markdown"].read_text()
    section = text[text.index("## OOD groups"):].split("\n## ", 1)[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["Model", "Detector", "ID Acc", "near FPR@95 OOD-pos", "near FPR@95", "near AUROC",
                      "far FPR@95 OOD-pos", "far FPR@95", "far AUROC"]
    rows = {r[1]: r for r in ([c.strip().replace("\\_", "_") for c in ln.strip("|").split("|")] for ln in lines[1:])}
    assert set(rows) == {"msp", "energy", "react", "she", "ash_b"}
    groups = {"near": ["cifar100", "tin"], "far": ["mnist", "svhn", "texture", "places365"]}
    for det, row in rows.items():
        d = df[df["detector"] == det].set_index("dataset")
        want = [f"{100 * d.loc[groups[g], m].mean():.1f}" for g in ("near", "far") for m in ("fpr95_ood_positive", "fpr95", "auroc")]
        assert row[3:] == want, det


def test_openoods_validation_lists_serve_as_the_selection(tmp_path):
    from oodeval.experiment import load_config

    make_openood_root(tmp_path / "openood", n_train=1, n_test=1, n_ood=1)
    lists = tmp_path / "openood" / "benchmark_imglist" / "cifar10"
    for name in (BENCHMARKS["cifar10"]["id_val"], BENCHMARKS["cifar10"]["ood_val"]):
        (lists / name).write_text("cifar10/test/0_0.png 0\n")
    exp = _experiment(tmp_path, tmp_path / "openood", detectors=("msp",))
    text = exp.read_text()
    assert "detectors = ['msp']" in text
    exp.write_text(text.replace("detectors = ['msp']", 'detectors = [{ name = "knn", search = { k = [1, 2] } }]')
                   + f'[selection]\nvalidation_id = "{lists / "val_cifar10.txt"}"\nvalidation_ood = "{lists / "val_tin.txt"}"\n')
    cfg = load_config(exp)
    assert cfg.detectors[0].search == {"k": [1, 2]}
    assert (cfg.selection.validation_id.name, cfg.selection.validation_ood.name) == (str(lists / "val_cifar10.txt"), str(lists / "val_tin.txt"))
    assert [(d.label, d.group) for d in cfg.ood] == [("cifar100", "near"), ("tin", "near"), ("mnist", "far"), ("svhn", "far"),
                                                      ("texture", "far"), ("places365", "far")]
    assert resolve(cfg.selection.validation_id.name).labels.tolist() == [0]  # an ID list of the benchmark keeps its labels
