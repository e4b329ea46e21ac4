"""The sampled image hash and ``--full-image-hash`` at every entry point (``evaluate``, ``run`` and the
experiment file's ``full_image_hash``): an uncompressed image edited in place, outside the three sampled
16 KiB regions, with its size and mtime kept, is reused stale by the sampled hash (the documented limit)
and extracted again with the full one."""

from __future__ import annotations

import os

import numpy as np
from PIL import Image
from test_grid_e2e import make_data

from oodeval import cli
from oodeval.data import Manifest
from oodeval.features import FeatureSet

KW = '{"num_classes": 3}'


def _entries(store) -> dict:
    """FeatureSet folder -> its dataset name, for every entry in the store."""
    return {p.parent: FeatureSet.load(p.parent).meta["dataset"] for p in store.rglob("meta.json")}


def _bmp(path) -> None:
    """A 160 x 160 RGB BMP: 54 header bytes + 76,800 pixel bytes = 76,854 bytes (the size measured in issue 40);
    square, so no centre crop cuts off the edited pixels."""
    a = np.random.default_rng(5).integers(0, 256, (160, 160, 3), dtype=np.uint8)
    Image.fromarray(a).save(path)
    assert path.stat().st_size == 76_854


def _edit_in_place(path) -> None:
    """Invert 64 bytes at offset 20,000 (outside the samples at 0, size/2 and the end) and restore the mtime."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[20_000:20_064] = bytes(255 - b for b in data[20_000:20_064])
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def test_evaluate_with_the_full_hash_catches_an_in_place_edit(tmp_path, capsys):
    make_data(tmp_path / "data")
    d = tmp_path / "data"
    bmp = d / "gray" / "edited.bmp"
    _bmp(bmp)
    store = tmp_path / "store"
    argv = ["evaluate", "--model", "test_resnet", "--pretrained", "none", "--model-kwargs", KW, "--train", str(d / "train"),
            "--test", str(d / "val"), "--ood", str(d / "gray"), "--detectors", "msp", "--store", str(store), "--draws", "0",
            "--device", "cpu", "--no-progress", "--format", "json"]  # fmt: skip
    assert cli.main(argv) == 0 and cli.main([*argv, "--full-image-hash"]) == 0
    before = _entries(store)
    assert len(before) == 6  # train, val, gray: under the sampled and under the full hash
    _edit_in_place(bmp)
    assert cli.main(argv) == 0
    assert _entries(store) == before  # the limit of the sampled hash: the stale entry is reused
    assert cli.main([*argv, "--full-image-hash"]) == 0
    new = {p: name for p, name in _entries(store).items() if p not in before}
    assert list(new.values()) == ["gray"], new
    capsys.readouterr()
    # the new entry holds the edited pixels: its features differ from those of both older gray entries
    fresh = FeatureSet.load(next(iter(new)))
    old = [FeatureSet.load(p) for p, name in before.items() if name == "gray"]
    assert len(old) == 2 and all(o.features.shape == fresh.features.shape for o in old)
    assert all(not np.array_equal(np.asarray(o.features), np.asarray(fresh.features)) for o in old)


def test_run_takes_the_full_hash_from_the_flag_and_the_experiment_file(tmp_path, capsys):
    make_data(tmp_path / "data")
    bmp = tmp_path / "data" / "gray" / "edited.bmp"
    _bmp(bmp)
    body = """
name = "hash"
seeds = [0]
bootstrap_draws = 50
batch_size = 16
device = "cpu"
[datasets]
id_train = "data/train"
id_test = "data/val"
ood = ["data/gray"]
[[models]]
name = "timm:test_resnet"
pretrained = false
model_kwargs = { num_classes = 3 }
[[detectors]]
name = "msp"
"""
    exp = tmp_path / "exp.toml"
    exp.write_text(body)
    assert cli.main(["run", str(exp), "--no-progress", "--full-image-hash"]) == 0
    store = tmp_path / "store"
    before = _entries(store)
    assert sorted(before.values()) == ["gray", "train", "val"]
    _edit_in_place(bmp)
    exp.write_text(body.replace('device = "cpu"', 'device = "cpu"\nfull_image_hash = true'))
    assert cli.main(["run", str(exp), "--no-progress"]) == 0
    new = {p: name for p, name in _entries(store).items() if p not in before}
    # the file's key and the flag key the cache alike (train and val reused); the edited set is extracted again
    assert list(new.values()) == ["gray"], new
    capsys.readouterr()
    exp.write_text(body.replace('device = "cpu"', 'device = "cpu"\nfull_image_hash = "yes"'))
    assert cli.main(["run", str(exp), "--check"]) == 2
    assert "full_image_hash" in capsys.readouterr().err


def test_the_images_digest_takes_file_names_that_are_not_utf8(tmp_path):
    """A POSIX file name with a byte that is not UTF-8 reaches Python as a lone surrogate: hashed by its bytes."""
    name = os.fsdecode(b"img\xff.bmp")
    try:
        _bmp(tmp_path / name)
    except (UnicodeEncodeError, OSError):  # a file system that refuses such names: nothing to hash
        return
    m = Manifest([name], np.array([0]), root=tmp_path)
    sampled, full = m.images_digest(), m.images_digest(full=True)
    _edit_in_place(tmp_path / name)
    assert m.images_digest() == sampled and m.images_digest(full=True) != full  # the limit and the full hash, again
