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
        for i in (2, 0, 1):  # not in name order: members are read ahead in archive order
            _add(tf, f"{top}/{sub}/{i}.jpg", _jpeg((i * 50, 0, 0)))
        _add(tf, f"{top}/.hidden/x.jpg", b"not an image")  # hidden entries (macOS resource forks) are skipped
    root = tmp_path / "data"
    assert convert("odin", archive, root) == root / name
    m = resolve(name, root, strict=False)
    assert len(m) == 3 and (m.labels == -1).all() and m.meta["role"] == "ood"
    assert all((root / name / p).is_file() for p in m.paths)
    for i, p in enumerate(m.paths):  # each output holds its own member's pixels
        assert abs(int(np.asarray(Image.open(m.resolve_path(i)))[0, 0, 0]) - 50 * int(p[0])) <= 3


def test_cli_convert_errors(tmp_path, capsys):
    assert main(["datasets", "convert", "cifar10", "--data-root", str(tmp_path)]) == 2
    assert "usage" in capsys.readouterr().err
    assert main(["datasets", "convert", "mnist", str(tmp_path), "--data-root", str(tmp_path)]) == 2
    assert "unknown format" in capsys.readouterr().err


# ---------------------------------------------------------------- crafted and damaged downloads


def _files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _link(tf, name, target):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    tf.addfile(info)


def _cifar10_archive(path, names=None, extra=None, labels=None):
    """A CIFAR-10 python archive with 2 images per batch; ``extra(tf)`` adds crafted members."""
    rng = np.random.default_rng(5)
    names = names or [f"c{i}".encode() for i in range(10)]
    with tarfile.open(path, "w:gz") as tf:
        _add(tf, "cifar-10-batches-py/batches.meta", pickle.dumps({b"label_names": names}, protocol=2))
        for b in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            batch = _cifar_batch(2, rng)
            if labels is not None and b == "data_batch_1":
                batch[b"labels"] = labels
            _add(tf, f"cifar-10-batches-py/{b}", pickle.dumps(batch, protocol=2))
        if extra:
            extra(tf)
    return path


def _tiny_zip(path, wnids=("n01", "n02"), extra=None, val_wnid="n02"):
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("tiny-imagenet-200/wnids.txt", "\n".join(wnids) + "\n")
        zf.writestr("tiny-imagenet-200/train/n01/images/n01_0.JPEG", _jpeg((1, 2, 3)))
        zf.writestr("tiny-imagenet-200/val/images/val_0.JPEG", _jpeg((200, 0, 0)))
        zf.writestr("tiny-imagenet-200/val/val_annotations.txt", f"val_0.JPEG\t{val_wnid}\t0\t0\t63\t63\n")
        if extra:
            extra(zf)
    return path


def _zip_link(zf, name, target):
    info = zipfile.ZipInfo(name)
    info.external_attr = (0o120777) << 16  # S_IFLNK
    zf.writestr(info, target)


def _odin_tar(path, extra):
    with tarfile.open(path, "w:gz") as tf:
        _add(tf, "LSUN/test/0.jpg", _jpeg((9, 9, 9)))
        extra(tf)
    return path


_CRAFTED = {
    # (format, how the archive is crafted, the name the refusal must show)
    "cifar-dotdot-class": ("cifar10", lambda p: _cifar10_archive(p, names=[b"../../escaped"] + [b"c%d" % i for i in range(1, 10)]), "../../escaped"),
    "cifar-absolute-class": ("cifar10", lambda p: _cifar10_archive(p, names=[b"/tmp/abs"] + [b"c%d" % i for i in range(1, 10)]), "/tmp/abs"),
    "cifar-dotdot-member": ("cifar10", lambda p: _cifar10_archive(p, extra=lambda tf: _add(tf, "cifar-10-batches-py/../../x", b"1")), "cifar-10-batches-py/../../x"),
    "cifar-symlink-member": ("cifar10", lambda p: _cifar10_archive(p, extra=lambda tf: _link(tf, "cifar-10-batches-py/out", "/tmp")), "cifar-10-batches-py/out"),
    "tiny-dotdot-wnid": ("tinyimagenet", lambda p: _tiny_zip(p, wnids=("n01", "../../escaped"), val_wnid="../../escaped"), "../../escaped"),
    "tiny-absolute-member": ("tinyimagenet", lambda p: _tiny_zip(p, extra=lambda zf: zf.writestr("/abs/train/n01/images/x.JPEG", _jpeg((0, 0, 0)))), "/abs/train/n01/images/x.JPEG"),
    "tiny-symlink-member": ("tinyimagenet", lambda p: _tiny_zip(p, extra=lambda zf: _zip_link(zf, "tiny-imagenet-200/train/n02", "/tmp")), "tiny-imagenet-200/train/n02"),
    "odin-dotdot-member": ("odin", lambda p: _odin_tar(p, lambda tf: _add(tf, "LSUN/../../escape.jpg", _jpeg((1, 1, 1)))), "LSUN/../../escape.jpg"),
    "odin-absolute-member": ("odin", lambda p: _odin_tar(p, lambda tf: _add(tf, "/tmp/LSUN/abs.jpg", _jpeg((1, 1, 1)))), "/tmp/LSUN/abs.jpg"),
    "odin-symlink-member": ("odin", lambda p: _odin_tar(p, lambda tf: _link(tf, "LSUN/test/link.jpg", "/etc/passwd")), "LSUN/test/link.jpg"),
}


@pytest.mark.parametrize("case", list(_CRAFTED))
def test_crafted_archives_write_nothing_and_name_the_member(tmp_path, capsys, case):
    fmt, craft, shown = _CRAFTED[case]
    archive = craft(tmp_path / ("src.zip" if fmt == "tinyimagenet" else "src.tar.gz"))
    (tmp_path / "data").mkdir()
    before = _files(tmp_path)
    assert main(["datasets", "convert", fmt, str(archive), "--data-root", str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("oodeval datasets: error: ") and repr(shown) in err, err
    assert _files(tmp_path) == before  # nothing written anywhere, not even a staging folder


def test_cli_as_name_cannot_leave_the_data_root(tmp_path, capsys):
    archive = _odin_tar(tmp_path / "LSUN.tar.gz", lambda tf: None)
    assert main(["datasets", "convert", "odin", str(archive), "--data-root", str(tmp_path / "d"), "--as", "../out"]) == 2
    assert "'../out'" in capsys.readouterr().err and not (tmp_path / "out").exists()


def _err(capsys):
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("oodeval datasets: error: "), err
    return err


def test_wrong_content_is_refused_naming_the_member(tmp_path, capsys, monkeypatch):
    from scipy.io import savemat

    root = str(tmp_path / "data")
    bad_label = _cifar10_archive(tmp_path / "labels.tar.gz", labels=[-1, 3])
    assert main(["datasets", "convert", "cifar10", str(bad_label), "--data-root", root]) == 2
    assert "labels.tar.gz:cifar-10-batches-py/data_batch_1: 1 labels outside 0..9" in _err(capsys)

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    evil = _cifar10_archive(tmp_path / "evil.tar.gz", extra=None)
    with tarfile.open(tmp_path / "evil2.tar.gz", "w:gz") as out, tarfile.open(evil) as inp:
        for m in inp.getmembers():
            data = pickle.dumps({b"data": Evil()}) if m.name.endswith("test_batch") else inp.extractfile(m).read()
            _add(out, m.name, data)
    assert main(["datasets", "convert", "cifar10", str(tmp_path / "evil2.tar.gz"), "--data-root", root]) == 2
    err = _err(capsys)
    assert "evil2.tar.gz:cifar-10-batches-py/test_batch: not a readable CIFAR pickle" in err and "builtins.print" in err

    nokey = tmp_path / "nokey"
    nokey.mkdir()
    (nokey / "batches.meta").write_bytes(pickle.dumps({b"names": []}))
    assert main(["datasets", "convert", "cifar10", str(nokey), "--data-root", root]) == 2
    assert f"{nokey / 'batches.meta'}: no 'label_names' entry (found: names)" in _err(capsys)

    whole = (tmp_path / "labels.tar.gz").read_bytes()
    (tmp_path / "cut.tar.gz").write_bytes(whole[: len(whole) // 2])
    assert main(["datasets", "convert", "cifar10", str(tmp_path / "cut.tar.gz"), "--data-root", root]) == 2
    assert "cut.tar.gz" in _err(capsys)

    svhn = tmp_path / "svhn"
    svhn.mkdir()
    x = np.zeros((32, 32, 3, 2), np.uint8)
    savemat(svhn / "test_32x32.mat", {"X": x, "y": np.array([[1], [11]])})
    assert main(["datasets", "convert", "svhn", str(svhn), "--data-root", root]) == 2
    assert "test_32x32.mat: 1 labels outside 1..10" in _err(capsys)
    savemat(svhn / "test_32x32.mat", {"X": x.astype(np.float64) + 0.5, "y": np.array([[1], [2]])})
    assert main(["datasets", "convert", "svhn", str(svhn), "--data-root", root]) == 2
    assert "test_32x32.mat: 'X' must be uint8 pixels, got float64" in _err(capsys)

    dup = _odin_tar(tmp_path / "dup.tar.gz", lambda tf: _add(tf, "LSUN/other/0.jpg", _jpeg((5, 5, 5))))
    assert main(["datasets", "convert", "odin", str(dup), "--data-root", root]) == 2
    err = _err(capsys)
    assert "dup.tar.gz:LSUN/test/0.jpg: gives the output name '0.jpg'" in err and "dup.tar.gz:LSUN/other/0.jpg" in err
    junk = _odin_tar(tmp_path / "junk.tar.gz", lambda tf: _add(tf, "LSUN/test/1.jpg", b"<html>not found</html>"))
    assert main(["datasets", "convert", "odin", str(junk), "--data-root", root]) == 2
    assert "junk.tar.gz:LSUN/test/1.jpg: not a readable image" in _err(capsys)
    monkeypatch.setitem(__import__("oodeval.data.convert", fromlist=["LIMITS"]).LIMITS, "image", 100)
    big = _odin_tar(tmp_path / "big.tar.gz", lambda tf: None)
    assert main(["datasets", "convert", "odin", str(big), "--data-root", root]) == 2
    assert "big.tar.gz:LSUN/test/0.jpg:" in _err(capsys)
    assert not (tmp_path / "data").exists() or _files(tmp_path / "data") == []


def test_a_lone_svhn_test_file_converts(tmp_path):
    from scipy.io import savemat

    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, size=(32, 32, 3, 4), dtype=np.uint8)
    savemat(tmp_path / "test_32x32.mat", {"X": x, "y": np.array([[10], [1], [2], [10]], dtype=np.uint8)})
    root = tmp_path / "data"
    assert main(["datasets", "convert", "svhn", str(tmp_path / "test_32x32.mat"), "--data-root", str(root)]) == 0
    m = resolve("svhn:test", root, strict=False)
    assert sorted(m.labels.tolist()) == [0, 0, 1, 2] and set(m.split) == {"test"}
    first = m.select(split="test")
    i = first.labels.tolist().index(1)
    assert np.array_equal(np.asarray(Image.open(first.resolve_path(i))), x[..., 1])


def test_a_folder_symlink_leading_outside_is_refused(tmp_path, capsys):
    src = tmp_path / "src" / "LSUN" / "test"
    src.mkdir(parents=True)
    (src / "0.jpg").write_bytes(_jpeg((9, 9, 9)))
    (tmp_path / "secret.jpg").write_bytes(_jpeg((1, 2, 3)))
    (src / "link.jpg").symlink_to(tmp_path / "secret.jpg")
    assert main(["datasets", "convert", "odin", str(tmp_path / "src"), "--data-root", str(tmp_path / "data")]) == 2
    err = _err(capsys)
    assert f"{src / 'link.jpg'}: a symbolic link leading outside" in err and not (tmp_path / "data").exists()
