"""Official dataset downloads -> image folders + ``manifest.csv`` under the data root.

``convert(fmt, source, data_root)`` reads one dataset in the format its authors publish and writes
``<data_root>/<name>/`` in the layout :mod:`oodeval.data.registry` documents for that name, plus a
``manifest.csv`` (path, label, split, class_name) that the registry reads first:

- ``cifar10`` / ``cifar100``: the "python version" (``cifar-10-python.tar.gz`` or the extracted
  ``cifar-10-batches-py`` / ``cifar-100-python`` folder). The batches are Python pickles; they are
  read with a restricted unpickler that admits only what these files contain (numpy's array
  reconstruction, ``ndarray``, ``dtype`` and ``_codecs.encode``) and refuses any other global, so
  a crafted file cannot run code. CIFAR-100 uses the 100 fine labels.
- ``svhn``: ``train_32x32.mat`` / ``test_32x32.mat`` (MATLAB v5 files, read by
  ``scipy.io.loadmat``; ``X`` is (32, 32, 3, N), label 10 means digit 0), from a folder or a file.
- ``tinyimagenet``: ``tiny-imagenet-200.zip`` or its folder (``wnids.txt``,
  ``train/<wnid>/images``, ``val/images`` + ``val_annotations.txt``); labels = index of the wnid
  in sorted order (as the CnC release and torchvision do); the JPEG bytes are copied unchanged.
- ``odin``: the ODIN OOD archives (Liang et al. 2018): ``LSUN.tar.gz``, ``LSUN_resize.tar.gz``,
  ``iSUN.tar.gz``, ``Imagenet.tar.gz``, ``Imagenet_resize.tar.gz`` (or their folders), named by
  their top folder: lsun-crop, lsun-resize, isun, tin-crop, tin-resize (unlabelled).

The output folder is built beside its target and renamed into place with oodeval's output
marker; an existing target is refused (nothing is replaced). Archive members are read by name, never extracted to their own
paths, so a member name cannot write outside the output folder.
"""

from __future__ import annotations

import io
import os
import pickle
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .._io import atomic_folder
from .manifest import IMAGE_EXTENSIONS, Manifest

__all__ = ["FORMATS", "ODIN_SETS", "convert", "load_cifar_pickle"]

#: ODIN archive top folder -> registry name
ODIN_SETS = {"LSUN": "lsun-crop", "LSUN_resize": "lsun-resize", "iSUN": "isun", "Imagenet": "tin-crop",
             "Imagenet_resize": "tin-resize"}  # fmt: skip

_PICKLE_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
}  # fmt: skip


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _PICKLE_GLOBALS:
            raise pickle.UnpicklingError(f"refusing {module}.{name}: a CIFAR batch holds only numpy arrays, lists and bytes")
        return super().find_class(module, name)


def load_cifar_pickle(data: bytes) -> dict:
    """One CIFAR batch / meta pickle as a dict with ``str`` keys (restricted unpickler, latin1 for Python 2 files)."""
    obj = _RestrictedUnpickler(io.BytesIO(data), encoding="bytes").load()
    if not isinstance(obj, dict):
        raise ValueError(f"a CIFAR pickle holds a dict, got {type(obj).__name__}")
    return {(k.decode("latin1") if isinstance(k, bytes) else k): v for k, v in obj.items()}


# ---------------------------------------------------------------- reading sources


class _Source:
    """Files of a folder, a .tar(.gz) or a .zip, by their path relative to the top."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if path.is_dir():
            self.names = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())
            self._read = lambda n: (path / n).read_bytes()
        elif zipfile.is_zipfile(path):
            zf = zipfile.ZipFile(path)
            self.names = sorted(i.filename for i in zf.infolist() if not i.is_dir())
            self._read = zf.read
        elif path.is_file() and tarfile.is_tarfile(path):
            tf = tarfile.open(path)
            members = {m.name: m for m in tf.getmembers() if m.isfile()}
            self.names = sorted(members)
            self._read = lambda n: tf.extractfile(members[n]).read()
        else:
            raise ValueError(f"{path} is neither a folder nor a .zip / .tar(.gz) archive")

    def read(self, name: str) -> bytes:
        return self._read(name)

    def find(self, basename: str) -> str:
        """The one file called ``basename`` (at any depth)."""
        hits = [n for n in self.names if n.rsplit("/", 1)[-1] == basename]
        if len(hits) != 1:
            raise FileNotFoundError(f"{self.path}: expected one file named {basename}, found {len(hits)}")
        return hits[0]


def _png(image: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, "PNG")
    return buf.getvalue()


def _cifar(src: _Source, fine: bool) -> Iterator[tuple[str, int, str, bytes]]:
    if fine:
        names = load_cifar_pickle(src.read(src.find("meta")))["fine_label_names"]
        batches = [("train", "train"), ("test", "test")]
        key = "fine_labels"
    else:
        names = load_cifar_pickle(src.read(src.find("batches.meta")))["label_names"]
        batches = [(f"data_batch_{i}", "train") for i in range(1, 6)] + [("test_batch", "test")]
        key = "labels"
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    for file, split in batches:
        batch = load_cifar_pickle(src.read(src.find(file)))
        data = np.asarray(batch["data"], dtype=np.uint8)
        labels = np.asarray(batch[key], dtype=np.int64)
        if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
            raise ValueError(f"{file}: expected data (N, 3072) and N labels, got {data.shape} and {len(labels)}")
        images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        for i, (img, y) in enumerate(zip(images, labels)):
            yield f"{split}/{names[y]}/{file}-{i:05d}.png", int(y), split, _png(img), names


def _svhn(src: _Source):
    from scipy.io import loadmat

    names = [str(d) for d in range(10)]
    for split in ("train", "test"):
        mat = loadmat(io.BytesIO(src.read(src.find(f"{split}_32x32.mat"))))
        x, y = np.asarray(mat["X"], dtype=np.uint8), np.asarray(mat["y"]).reshape(-1).astype(np.int64) % 10
        if x.ndim != 4 or x.shape[:3] != (32, 32, 3) or x.shape[3] != len(y):
            raise ValueError(f"{split}_32x32.mat: expected X (32, 32, 3, N) and N labels, got {x.shape} and {len(y)}")
        for i in range(len(y)):
            yield f"{split}/{y[i]}/{i:06d}.png", int(y[i]), split, _png(x[..., i]), names


def _tinyimagenet(src: _Source):
    wnids = sorted(src.read(src.find("wnids.txt")).decode().split())
    index = {w: i for i, w in enumerate(wnids)}
    ann = {}
    for line in src.read(src.find("val_annotations.txt")).decode().splitlines():
        parts = line.split("\t")
        if len(parts) >= 2:
            ann[parts[0]] = parts[1]
    for name in src.names:
        parts = name.split("/")
        base = parts[-1]
        if not base.lower().endswith((".jpeg", ".jpg")) or len(parts) < 3 or parts[-2] != "images":
            continue
        if parts[-4:-3] == ["train"] and parts[-3] in index:
            wnid, split = parts[-3], "train"
        elif parts[-3] == "val" and base in ann:
            wnid, split = ann[base], "val"
        else:
            continue  # the unlabelled test split
        yield f"{split}/{wnid}/{base}", index[wnid], split, src.read(name), wnids


def _odin(src: _Source):
    tops = {n.split("/")[0] for n in src.names if "/" in n}
    known = [t for t in tops if t in ODIN_SETS]
    if len(known) != 1:
        raise ValueError(f"{src.path}: expected one ODIN folder ({', '.join(ODIN_SETS)}), found {sorted(tops) or 'none'}")
    top = known[0]
    for name in src.names:
        if name.startswith(top + "/") and Path(name).suffix.lower() in IMAGE_EXTENSIONS and "/." not in name:
            yield Path(name).name, -1, None, src.read(name), None


FORMATS = ("cifar10", "cifar100", "svhn", "tinyimagenet", "odin")


def _target_name(fmt: str, src: _Source) -> str:
    if fmt != "odin":
        return fmt
    tops = {n.split("/")[0] for n in src.names if "/" in n} & set(ODIN_SETS)
    if len(tops) != 1:
        raise ValueError(f"{src.path}: expected one ODIN folder ({', '.join(ODIN_SETS)}), found {sorted(tops) or 'none'}")
    return ODIN_SETS[tops.pop()]


def convert(fmt: str, source: str | os.PathLike, data_root: str | os.PathLike, name: str | None = None) -> Path:
    """Convert ``source`` (format ``fmt``, one of :data:`FORMATS`) into ``<data_root>/<name>/``.

    ``name`` defaults to the registry name (the format's, or the ODIN set's). Returns the folder;
    an existing folder is never replaced (ValueError).
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    source = Path(source)
    if not source.exists():
        raise FileNotFoundError(f"{source} does not exist")
    src = _Source(source)
    target = Path(data_root) / (name or _target_name(fmt, src))
    if target.exists():
        raise ValueError(f"{target} already exists; remove it or pass another --name (nothing was written)")
    rows = {"cifar10": lambda: _cifar(src, False), "cifar100": lambda: _cifar(src, True), "svhn": lambda: _svhn(src),
            "tinyimagenet": lambda: _tinyimagenet(src), "odin": lambda: _odin(src)}[fmt]()  # fmt: skip
    paths, labels, splits, class_names = [], [], [], None
    with atomic_folder(target, "converted dataset") as tmp:
        for rel, label, split, data, names in rows:
            out = tmp / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
            paths.append(rel)
            labels.append(label)
            splits.append(split)
            class_names = names
        if not paths:
            raise ValueError(f"{source} holds no images in the {fmt} format")
        m = Manifest(paths, labels, split=None if splits[0] is None else splits, class_names=class_names,
                     root=tmp, name=target.name)  # fmt: skip
        (tmp / "manifest.csv").write_text(m.to_csv_text(relative_to=Path(os.path.abspath(tmp))))
    return target
