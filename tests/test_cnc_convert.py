"""`oodeval datasets convert`: small generated files in each official format -> registry manifests."""

import io
import pickle
import tarfile
import zipfile

import numpy as np
import pytest
from PIL import Image

from oodeval.cli import main
from oodeval.data import resolve
from oodeval.data.convert import convert, load_cifar_pickle


def _cifar_batch(n, rng, key="labels", k=10):
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    return {b"batch_label": b"x", key.encode(): rng.integers(0, k, n).tolist(), b"data": data,
            b"filenames": [b"f%d.png" % i for i in range(n)]}  # fmt: skip


def _add(tf, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))


def test_cifar10_pickles_from_the_archive(tmp_path, capsys):
    rng = np.random.default_rng(0)
    names = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"]
    batches = {f"data_batch_{i}": _cifar_batch(3, rng) for i in range(1, 6)}
    batches["test_batch"] = _cifar_batch(4, rng)
    with tarfile.open(tmp_path / "cifar-10-python.tar.gz", "w:gz") as tf:
        _add(tf, "cifar-10-batches-py/batches.meta", pickle.dumps({b"label_names": names}, protocol=2))
        for name, b in batches.items():
            _add(tf, f"cifar-10-batches-py/{name}", pickle.dumps(b, protocol=2))
    root = tmp_path / "data"
    assert main(["datasets", "convert", "cifar10", str(tmp_path / "cifar-10-python.tar.gz"), "--data-root", str(root)]) == 0
    assert "19 images" in capsys.readouterr().out
    m = resolve("cifar10", root, strict=False)
    assert len(m) == 19 and sorted(set(m.split)) == ["test", "train"]
    assert all(m.class_names[y] == names[y].decode() for y in m.labels)
    test = m.select(split="test")
    assert test.labels.tolist() == [int(v) for v in batches["test_batch"][b"labels"]]
    # pixels: row-major 3 x 32 x 32 planes -> HWC
    first = np.asarray(Image.open(test.resolve_path(0)))
    assert np.array_equal(first, batches["test_batch"][b"data"][0].reshape(3, 32, 32).transpose(1, 2, 0))
    # an existing target is never replaced
    with pytest.raises(ValueError, match="already exists"):
        convert("cifar10", tmp_path / "cifar-10-python.tar.gz", root)


def test_cifar100_folder_and_the_restricted_unpickler(tmp_path):
    rng = np.random.default_rng(1)
    src = tmp_path / "cifar-100-python"
    src.mkdir()
    fine = [f"class{i:02d}".encode() for i in range(100)]
    (src / "meta").write_bytes(pickle.dumps({b"fine_label_names": fine, b"coarse_label_names": []}, protocol=2))
    (src / "train").write_bytes(pickle.dumps(_cifar_batch(5, rng, "fine_labels", 100), protocol=2))
    (src / "test").write_bytes(pickle.dumps(_cifar_batch(2, rng, "fine_labels", 100), protocol=2))
    m = resolve(convert("cifar100", src, tmp_path / "data"), strict=False)
    assert len(m) == 7 and all(m.class_names[y] == f"class{y:02d}" for y in m.labels)

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    with pytest.raises(pickle.UnpicklingError, match="refusing builtins.print"):
        load_cifar_pickle(pickle.dumps({b"data": Evil()}))


def test_svhn_mat_files(tmp_path):
    from scipy.io import savemat

    rng = np.random.default_rng(2)
    src = tmp_path / "svhn-src"
    src.mkdir()
    ys = {}
    for split, n in (("train", 5), ("test", 3)):
        y = rng.integers(1, 11, size=(n, 1))  # 10 = digit 0
        ys[split] = y.ravel() % 10
        savemat(src / f"{split}_32x32.mat", {"X": rng.integers(0, 256, size=(32, 32, 3, n), dtype=np.uint8), "y": y})
    root = tmp_path / "data"
    convert("svhn", src, root)
    m = resolve("svhn:test", root, strict=False)
    assert m.labels.tolist() == sorted(ys["test"].tolist()) or sorted(m.labels.tolist()) == sorted(ys["test"].tolist())
    assert len(resolve("svhn", root, strict=False)) == 8 and m.num_classes == 10


def _jpeg(color):
    buf = io.BytesIO()
    Image.new("RGB", (64, 64), color).save(buf, "JPEG")
    return buf.getvalue()


def test_tinyimagenet_zip(tmp_path):
    wnids = ["n02", "n01"]
    with zipfile.ZipFile(tmp_path / "tiny-imagenet-200.zip", "w") as zf:
        zf.writestr("tiny-imagenet-200/wnids.txt", "\n".join(wnids) + "\n")
        for w in wnids:
            for k in range(2):
                zf.writestr(f"tiny-imagenet-200/train/{w}/images/{w}_{k}.JPEG", _jpeg((10, 20, 30)))
            zf.writestr(f"tiny-imagenet-200/train/{w}/{w}_boxes.txt", "")
        zf.writestr("tiny-imagenet-200/val/images/val_0.JPEG", _jpeg((200, 0, 0)))
        zf.writestr("tiny-imagenet-200/val/val_annotations.txt", "val_0.JPEG\tn02\t0\t0\t63\t63\n")
        zf.writestr("tiny-imagenet-200/test/images/test_0.JPEG", _jpeg((0, 0, 0)))
    root = tmp_path / "data"
    convert("tinyimagenet", tmp_path / "tiny-imagenet-200.zip", root)
    m = resolve("tinyimagenet", root, strict=False)
    assert len(m) == 5 and m.class_names == ["n01", "n02"] and m.meta["role"] == "id"
    val = resolve("tinyimagenet:val", root, strict=False)
    assert val.labels.tolist() == [1] and np.asarray(Image.open(val.resolve_path(0))).shape == (64, 64, 3)


@pytest.mark.parametrize("top,name", [("LSUN", "lsun-crop"), ("iSUN", "isun"), ("Imagenet_resize", "tin-resize")])
def test_odin_archives(tmp_path, top, name):
    archive = tmp_path / f"{top}.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        sub = "iSUN_patches" if top == "iSUN" else "test"
        for i in range(3):
            _add(tf, f"{top}/{sub}/{i}.jpg", _jpeg((i * 50, 0, 0)))
        _add(tf, f"{top}/../escape.jpg", _jpeg((1, 1, 1)))
    root = tmp_path / "data"
    assert convert("odin", archive, root) == root / name
    m = resolve(name, root, strict=False)
    assert len(m) == 3 and (m.labels == -1).all() and m.meta["role"] == "ood"  # the "../" member is skipped
    assert not (tmp_path / "escape.jpg").exists() and all((root / name / p).is_file() for p in m.paths)


def test_cli_convert_errors(tmp_path, capsys):
    assert main(["datasets", "convert", "cifar10", "--data-root", str(tmp_path)]) == 2
    assert "usage" in capsys.readouterr().err
    assert main(["datasets", "convert", "mnist", str(tmp_path), "--data-root", str(tmp_path)]) == 2
    assert "unknown format" in capsys.readouterr().err
