"""Manifests, image loading and the named-dataset registry, on generated files."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from oodeval.data import REGISTRY, ImageError, Manifest, open_image, read_idx, resolve, status


def _png(path: Path, seed: int, size: int = 12) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)).save(path)


def test_csv_roundtrip_keeps_every_column(tmp_path: Path) -> None:
    for i in range(4):
        _png(tmp_path / "img" / f"{i}.png", i)
    csv = tmp_path / "m.csv"
    csv.write_text("path,label,ood_label,fine_grained,split\n"
                   "img/0.png,-1,tabby cat,1,a\nimg/1.png,-1,lynx,0,b\nimg/2.png,2,,false,a\nimg/3.png,0,,true,b\n")
    m = Manifest.from_csv(csv)
    assert m.labels.tolist() == [-1, -1, 2, 0]
    assert m.ood_label == ["tabby cat", "lynx", "", ""]
    assert m.fine_grained.tolist() == [True, False, False, True]
    assert m.resolve_path(1) == str(tmp_path / "img" / "1.png")
    out = m.to_csv(tmp_path / "copy" / "m.csv")
    again = Manifest.from_csv(out, root=tmp_path)
    assert again.labels.tolist() == m.labels.tolist() and again.ood_label == m.ood_label and again.split == m.split
    assert again.content_hash() == m.content_hash()
    assert [x for x in (tmp_path / "copy").iterdir()] == [out]  # no temporary files left
    b = m.select(split="b")
    assert b.paths == ["img/1.png", "img/3.png"] and b.fine_grained.tolist() == [False, True]
    assert len(m.select(fine_grained=True)) == 2
    with pytest.raises(ValueError, match="no split"):
        m.select(split="test")
    m.labels[2] = 1
    assert m.content_hash() != again.content_hash()


def test_csv_errors_and_class_name_labels(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("file,label\nx.png,1\n")
    with pytest.raises(ValueError, match="lacks column"):
        Manifest.from_csv(bad)
    named = tmp_path / "named.csv"
    named.write_text("path,label\na.png,dog\nb.png,cat\nc.png,-1\n")
    m = Manifest.from_csv(named)
    assert m.class_names == ["cat", "dog"] and m.labels.tolist() == [1, 0, -1]


def test_image_folder_labelled_and_unlabelled(tmp_path: Path) -> None:
    for c in ("zebra", "ant"):
        for i in range(2):
            _png(tmp_path / "id" / c / f"{i}.png", i)
    m = Manifest.from_image_folder(tmp_path / "id")
    assert m.class_names == ["ant", "zebra"] and m.labels.tolist() == [0, 0, 1, 1]
    u = Manifest.from_image_folder(tmp_path / "id", labelled=False)
    assert (u.labels == -1).all() and u.ood_label == ["ant", "ant", "zebra", "zebra"]
    _png(tmp_path / "id" / "loose.png", 9)
    with pytest.raises(ValueError, match="lie directly"):
        Manifest.from_image_folder(tmp_path / "id")


def test_registry_errors_show_layout_and_count(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as missing:
        resolve("ninco", tmp_path)
    assert "5,879" in str(missing.value) and "ninco/<ood class>/<image>" in str(missing.value)
    for i in range(3):
        _png(tmp_path / "isun" / f"{i}.png", i)
    with pytest.raises(ValueError) as wrong:
        resolve("isun", tmp_path)
    assert "found 3 images, expected 8,925" in str(wrong.value) and "isun/**/<image>" in str(wrong.value)
    m = resolve("isun", tmp_path, strict=False)
    assert len(m) == 3 and (m.labels == -1).all() and m.meta["role"] == "ood"
    with pytest.raises(FileNotFoundError, match="Registry names"):
        resolve("no-such-set", tmp_path)
    for name in ("cifar10", "cifar100", "svhn", "tin-crop", "tin-resize", "lsun-crop", "lsun-resize", "isun",
                 "imagenet1k-val", "fi-imagenet-1k", "ninco", "imagenet-o", "openimage-o", "inaturalist", "textures",
                 "places", "ssb-easy", "ssb-hard", "species", "in1k-ood", "imagenet-ood", "fashion-mnist"):
        assert name in REGISTRY


def test_user_dataset_split_suffix_and_env_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(3):
        _png(tmp_path / "mine" / "x" / f"{i}.png", i)
    (tmp_path / "mine" / "manifest.csv").write_text("path,label,split\nx/0.png,0,train\nx/1.png,1,train\nx/2.png,1,test\n")
    monkeypatch.setenv("OODEVAL_DATA", str(tmp_path))
    m = resolve("mine")
    assert m.name == "mine" and len(m) == 3
    t = resolve("mine:test")
    assert t.labels.tolist() == [1] and Path(t.resolve_path(0)).is_file()
    rows = {r["name"]: r for r in status()}
    assert rows["mine"]["found"] == 3 and rows["isun"]["state"] == "missing"


def test_cifar_and_imagenet_layouts(tmp_path: Path) -> None:
    for split, n in (("train", 2), ("test", 1)):
        for c in ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]:
            for i in range(n):
                _png(tmp_path / "cifar10" / split / c / f"{i}.png", i)
    m = resolve("cifar10", tmp_path, strict=False)
    assert len(m) == 30 and m.num_classes == 10 and m.class_names[9] == "truck"
    assert m.select(split="test").labels.tolist() == list(range(10))
    with pytest.raises(ValueError, match="expected 60,000"):
        resolve("cifar10", tmp_path)
    for i in range(2):
        for d in range(10):
            _png(tmp_path / "svhn" / "test" / str(d) / f"{i}.png", i)
    svhn = resolve("svhn:test", tmp_path, strict=False)
    assert svhn.split == ["test"] * 20 and svhn.labels.tolist() == sorted(list(range(10)) * 2)
    assert Path(svhn.resolve_path(1)).is_file()

    synsets = (Path(__import__("importlib.util").util.find_spec("timm").submodule_search_locations[0])
               / "data" / "_info" / "imagenet_synsets.txt").read_text().split()
    assert synsets == sorted(synsets)
    val = tmp_path / "imagenet1k-val"
    names = ["ILSVRC2012_val_00000001", "ILSVRC2012_val_00000002"]
    for i, n in enumerate(names):
        _png(val / f"{n}.JPEG", i)
    wn = [synsets[65], synsets[970]]
    (val / "LOC_val_solution.csv").write_text("ImageId,PredictionString\n"
                                              f"{names[1]},{wn[1]} 1 2 3 4\n{names[0]},{wn[0]} 5 6 7 8 {wn[0]} 1 1 1 1\n")
    m = resolve("imagenet1k-val", tmp_path, strict=False)
    assert m.labels.tolist() == [65, 970] and m.paths[0].endswith("00000001.JPEG") and m.num_classes == 1000


def test_idx_container_and_corrupt_files(tmp_path: Path) -> None:
    arr = np.random.default_rng(0).integers(0, 256, (3, 5, 4), dtype=np.uint8)
    f = tmp_path / "t-images-idx3-ubyte.gz"
    with gzip.open(f, "wb") as fh:
        fh.write(bytes([0, 0, 8, 3]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape) + arr.tobytes())
    read_idx.cache_clear()
    assert np.array_equal(read_idx(str(f)), arr)
    img = open_image(f"{f}#2", "L")
    assert img.size == (4, 5) and np.array_equal(np.asarray(img), arr[2])
    with pytest.raises(ImageError, match="index outside"):
        open_image(f"{f}#3")
    _png(tmp_path / "ok.png", 0)
    data = (tmp_path / "ok.png").read_bytes()
    (tmp_path / "trunc.png").write_bytes(data[: len(data) // 2])
    (tmp_path / "zero.jpg").write_bytes(b"")
    for name in ("trunc.png", "zero.jpg"):
        with pytest.raises(ImageError, match=name):
            open_image(str(tmp_path / name))


@pytest.mark.needs("fashion-mnist")
def test_fashion_mnist_from_debian_package() -> None:
    m = resolve("fashion-mnist:test")
    assert len(m) == 10_000 and m.num_classes == 10 and m.class_names[9] == "Ankle boot"
    with gzip.open("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz") as fh:
        raw = np.frombuffer(fh.read(), np.uint8, offset=8)
    assert np.array_equal(m.labels, raw)
    with gzip.open("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz") as fh:
        first = np.frombuffer(fh.read(16 + 784), np.uint8, offset=16).reshape(28, 28)
    assert np.array_equal(np.asarray(open_image(m.resolve_path(0), "L")), first)


def test_datasets_command_lists_registry_and_user_sets(tmp_path: Path) -> None:
    (tmp_path / "demo-set").mkdir()
    _png(tmp_path / "demo-set" / "a.png", 0)
    (tmp_path / "demo-set" / "manifest.csv").write_text("path,label\na.png,0\n")
    out = subprocess.run([sys.executable, "-m", "oodeval.cli", "datasets", "--data-root", str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    assert "imagenet1k-val" in out and "50,000" in out and "demo-set" in out and "ok (user dataset)" in out
