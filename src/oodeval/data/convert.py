"""Official dataset downloads -> image folders + ``manifest.csv`` under the data root.

``convert(fmt, source, data_root)`` reads one dataset in the format its authors publish and writes
``<data_root>/<name>/`` in the layout :mod:`oodeval.data.datasets` documents for that name, plus a
``manifest.csv`` (path, label, split, class_name) that the registry reads first:

- ``cifar10`` / ``cifar100``: the "python version" (``cifar-10-python.tar.gz`` or the extracted
  ``cifar-10-batches-py`` / ``cifar-100-python`` folder). The batches are Python pickles; they are
  read with a restricted unpickler that admits only what these files contain (numpy's array
  reconstruction, ``ndarray``, ``dtype`` and ``_codecs.encode``) and refuses any other global, so
  a crafted file cannot run code. CIFAR-100 uses the 100 fine labels.
- ``svhn``: ``train_32x32.mat`` and / or ``test_32x32.mat`` (MATLAB v5 files, read by
  ``scipy.io.loadmat``; ``X`` uint8 (32, 32, 3, N), ``y`` integers 1-10, 10 meaning digit 0),
  from a folder or one ``.mat`` file (a lone ``test_32x32.mat`` gives the test split only).
- ``tinyimagenet``: ``tiny-imagenet-200.zip`` or its folder (``wnids.txt``,
  ``train/<wnid>/images``, ``val/images`` + ``val_annotations.txt``); labels = index of the wnid
  in sorted order (as the CnC release and torchvision do); the JPEG bytes are copied unchanged.
- ``odin``: the ODIN OOD archives (Liang et al. 2018): ``LSUN.tar.gz``, ``LSUN_resize.tar.gz``,
  ``iSUN.tar.gz``, ``Imagenet.tar.gz``, ``Imagenet_resize.tar.gz`` (or their folders), named by
  their top folder: lsun-crop, lsun-resize, isun, tin-crop, tin-resize (unlabelled).

The output folder is built beside its target and renamed into place with oodeval's output
marker; an existing target is refused (nothing is replaced). Archive members are read by name
into memory, never extracted (:mod:`oodeval.data.archive` refuses absolute, ``..`` and link
members), and every output path is built from names checked to be plain file names (class
names, wnids, image file names, ``--as``) and checked to resolve inside the output folder.
What a format promises is checked, and a violation is a ValueError naming the file or member:
member sizes (:data:`LIMITS`), label ranges and integer types, uint8 pixels, the class count,
unique output names, and that copied images decode.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import numpy as np

from .._io import atomic_folder
from ..errors import InputError
from .archive import MiB, Source, safe_component
from .manifest import IMAGE_EXTENSIONS, Manifest

__all__ = ["FORMATS", "ODIN_SETS", "LIMITS", "convert", "load_cifar_pickle"]

#: ODIN archive top folder -> registry name
ODIN_SETS = {"LSUN": "lsun-crop", "LSUN_resize": "lsun-resize", "iSUN": "isun", "Imagenet": "tin-crop",
             "Imagenet_resize": "tin-resize"}  # fmt: skip

#: the largest member read, by kind (the official files: CIFAR-100 train 155 MB, SVHN train 182 MB,
#: Tiny-ImageNet / ODIN images a few kB, wnids.txt 2 kB, val_annotations.txt 0.3 MB)
LIMITS = {"pickle": 256 * MiB, "mat": 256 * MiB, "image": 4 * MiB, "text": 16 * MiB}

_CIFAR_CLASSES = {False: 10, True: 100}

_PICKLE_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
}  # fmt: skip

Row = tuple[str, int, "str | None", bytes, "list[str] | None", str]


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _PICKLE_GLOBALS:
            raise pickle.UnpicklingError(f"refusing {module}.{name}: a CIFAR batch holds only numpy arrays, lists and bytes")
        return super().find_class(module, name)


def load_cifar_pickle(data: bytes) -> dict:
    """One CIFAR batch / meta pickle as a dict with ``str`` keys (restricted unpickler, latin1 for Python 2 files)."""
    obj = _RestrictedUnpickler(io.BytesIO(data), encoding="bytes").load()
    if not isinstance(obj, dict):
        raise InputError(f"a CIFAR pickle holds a dict, got {type(obj).__name__}")
    return {(k.decode("latin1") if isinstance(k, bytes) else k): v for k, v in obj.items()}


def _pickle(src: Source, name: str) -> dict:
    """A CIFAR pickle member; any failure (a refused global, truncation) is a ValueError naming it."""
    data = src.read(name, LIMITS["pickle"])
    try:
        return load_cifar_pickle(data)
    except Exception as exc:  # noqa: BLE001 - the unpickler raises many types on crafted or cut input
        raise InputError(f"{src.where(name)}: not a readable CIFAR pickle ({type(exc).__name__}: {exc}); "
                         "nothing was written") from None


def _entry(d: dict, key: str, where: str):
    if key not in d:
        raise InputError(f"{where}: no {key!r} entry (found: {', '.join(map(str, d)) or 'none'})")
    return d[key]


def _integers(values, where: str, what: str) -> np.ndarray:
    """``values`` as int64 when every one is an integer (int dtype, or floats with integral values)."""
    a = np.asarray(values)
    if a.dtype.kind in "iu":
        return a.astype(np.int64).reshape(-1)
    if a.dtype.kind == "f" and np.isfinite(a).all() and (a == np.round(a)).all():
        return a.astype(np.int64).reshape(-1)
    raise InputError(f"{where}: {what} must be integers, got {a.dtype} values")


def _png(image: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, "PNG")
    return buf.getvalue()


def _checked_image(src: Source, name: str, formats: tuple[str, ...] | None = None) -> bytes:
    """The bytes of an image member, refused (naming it) unless PIL decodes it as one of ``formats``."""
    from PIL import Image

    data = src.read(name, LIMITS["image"])
    try:
        with Image.open(io.BytesIO(data)) as im:
            fmt = im.format
            im.verify()
    except Exception as exc:  # noqa: BLE001 - PIL raises many types on non-image bytes
        raise InputError(f"{src.where(name)}: not a readable image ({type(exc).__name__}: {exc}); nothing was written") from None
    if formats and fmt not in formats:
        raise InputError(f"{src.where(name)}: a {fmt} image where the format has {' / '.join(formats)}; nothing was written")
    return data


def _cifar(src: Source, fine: bool) -> Iterator[Row]:
    meta = src.find("meta" if fine else "batches.meta")
    raw = _entry(_pickle(src, meta), "fine_label_names" if fine else "label_names", src.where(meta))
    names = [n.decode("utf-8", "replace") if isinstance(n, bytes) else n for n in raw]
    k = _CIFAR_CLASSES[fine]
    if len(names) != k or len(set(names)) != k:
        raise InputError(f"{src.where(meta)}: expected {k} distinct class names, got {len(names)} ({len(set(names))} distinct)")
    names = [safe_component(n, "class name", src.where(meta)) for n in names]
    if fine:
        batches, key = [("train", "train"), ("test", "test")], "fine_labels"
    else:
        batches, key = [(f"data_batch_{i}", "train") for i in range(1, 6)] + [("test_batch", "test")], "labels"
    for file, split in batches:
        member = src.find(file)
        where = src.where(member)
        batch = _pickle(src, member)
        data = _entry(batch, "data", where)
        if not isinstance(data, np.ndarray) or data.dtype != np.uint8:
            raise InputError(f"{where}: 'data' must be a uint8 array, got {getattr(data, 'dtype', type(data).__name__)}")
        labels = _integers(_entry(batch, key, where), where, f"'{key}'")
        if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
            raise InputError(f"{where}: expected data (N, 3072) and N labels, got {data.shape} and {len(labels)}")
        bad = (labels < 0) | (labels >= k)
        if bad.any():
            raise InputError(f"{where}: {int(bad.sum())} labels outside 0..{k - 1} (e.g. {int(labels[bad][0])})")
        images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        for i, (img, y) in enumerate(zip(images, labels)):
            yield f"{split}/{names[y]}/{file}-{i:05d}.png", int(y), split, _png(img), names, member


def _svhn(src: Source) -> Iterator[Row]:
    from scipy.io import loadmat

    names = [str(d) for d in range(10)]
    members = {split: src.find(f"{split}_32x32.mat", required=False) for split in ("train", "test")}
    if not any(members.values()):
        raise FileNotFoundError(f"{src.path}: no train_32x32.mat or test_32x32.mat")
    for split, member in members.items():
        if member is None:
            continue
        where = src.where(member)
        try:
            mat = loadmat(io.BytesIO(src.read(member, LIMITS["mat"])))
        except ValueError as exc:
            if str(exc).startswith(where):
                raise
            raise InputError(f"{where}: not a readable MATLAB file ({exc})") from None
        except Exception as exc:  # noqa: BLE001 - scipy raises many types on cut files
            raise InputError(f"{where}: not a readable MATLAB file ({type(exc).__name__}: {exc})") from None
        x = np.asarray(_entry(mat, "X", where))
        y = _integers(_entry(mat, "y", where), where, "labels 'y'")
        if x.dtype != np.uint8:
            raise InputError(f"{where}: 'X' must be uint8 pixels, got {x.dtype}")
        if x.ndim != 4 or x.shape[:3] != (32, 32, 3) or x.shape[3] != len(y):
            raise InputError(f"{where}: expected X (32, 32, 3, N) and N labels, got {x.shape} and {len(y)}")
        bad = (y < 1) | (y > 10)
        if bad.any():
            raise InputError(f"{where}: {int(bad.sum())} labels outside 1..10 (10 = digit 0; e.g. {int(y[bad][0])})")
        y = y % 10
        for i in range(len(y)):
            yield f"{split}/{y[i]}/{i:06d}.png", int(y[i]), split, _png(x[..., i]), names, member


def _text(src: Source, name: str) -> str:
    try:
        return src.read(name, LIMITS["text"]).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{src.where(name)}: not UTF-8 text ({exc})") from None


def _tinyimagenet(src: Source) -> Iterator[Row]:
    wn = src.find("wnids.txt")
    wnids = sorted(safe_component(w, "wnid", src.where(wn)) for w in _text(src, wn).split())
    if len(set(wnids)) != len(wnids) or not wnids:
        raise InputError(f"{src.where(wn)}: expected distinct wnids, got {len(wnids)} ({len(set(wnids))} distinct)")
    index = {w: i for i, w in enumerate(wnids)}
    va = src.find("val_annotations.txt")
    ann = {}
    for n, line in enumerate(_text(src, va).splitlines(), 1):
        parts = line.split("\t")
        if len(parts) >= 2:
            if parts[1] not in index:
                raise InputError(f"{src.where(va)}: line {n} names wnid {parts[1]!r}, which wnids.txt does not list")
            ann[safe_component(parts[0], "image name", src.where(va))] = parts[1]
    for name in src.names:
        parts = name.split("/")
        base = parts[-1]
        if not base.lower().endswith((".jpeg", ".jpg")) or len(parts) < 3 or parts[-2] != "images":
            continue
        if parts[-4:-3] == ["train"]:
            if parts[-3] not in index:
                raise InputError(f"{src.where(name)}: train folder {parts[-3]!r} is not listed in wnids.txt")
            wnid, split = parts[-3], "train"
        elif parts[-3] == "val" and base in ann:
            wnid, split = ann[base], "val"
        else:
            continue  # the unlabelled test split
        yield f"{split}/{wnid}/{base}", index[wnid], split, _checked_image(src, name, ("JPEG",)), wnids, name


def _odin_top(src: Source) -> str:
    tops = {n.split("/")[0] for n in src.names if "/" in n} & set(ODIN_SETS)
    if len(tops) != 1:
        found = sorted({n.split("/")[0] for n in src.names if "/" in n})
        raise InputError(f"{src.path}: expected one ODIN folder ({', '.join(ODIN_SETS)}), found {found or 'none'}")
    return tops.pop()


def _odin(src: Source) -> Iterator[Row]:
    top = _odin_top(src)
    for name in src.names:
        if name.startswith(top + "/") and PurePosixPath(name).suffix.lower() in IMAGE_EXTENSIONS and "/." not in name:
            yield PurePosixPath(name).name, -1, None, _checked_image(src, name), None, name


FORMATS = ("cifar10", "cifar100", "svhn", "tinyimagenet", "odin")


def _inside(folder: Path, rel: str, where: str) -> Path:
    """``folder / rel`` when it stays inside ``folder`` (every part a plain name), else ValueError naming ``where``."""
    for part in rel.split("/"):
        safe_component(part, "output name part", where)
    out = folder / rel
    if not out.resolve().is_relative_to(folder.resolve()):
        raise InputError(f"{where}: output name {rel!r} resolves outside the output folder; refusing it")
    return out


def convert(fmt: str, source: str | os.PathLike, data_root: str | os.PathLike, name: str | None = None) -> Path:
    """Convert ``source`` (format ``fmt``, one of :data:`FORMATS`) into ``<data_root>/<name>/``.

    ``name`` defaults to the registry name (the format's, or the ODIN set's). Returns the folder;
    an existing folder is never replaced, and every problem with the source is a ValueError
    (or FileNotFoundError) naming the file or member, raised before the output appears.
    """
    if fmt not in FORMATS:
        raise InputError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    source = Path(source)
    if not source.exists():
        raise FileNotFoundError(f"{source} does not exist")
    src = Source(source)
    if name is not None:
        safe_component(name, "dataset name (--as)", str(data_root))
    target = Path(data_root) / (name or (ODIN_SETS[_odin_top(src)] if fmt == "odin" else fmt))
    if target.exists():
        raise InputError(f"{target} already exists; remove it or pass another --as NAME (nothing was written)")
    rows = {"cifar10": lambda: _cifar(src, False), "cifar100": lambda: _cifar(src, True), "svhn": lambda: _svhn(src),
            "tinyimagenet": lambda: _tinyimagenet(src), "odin": lambda: _odin(src)}[fmt]()  # fmt: skip
    paths, labels, splits, class_names, seen = [], [], [], None, {}
    with atomic_folder(target, "converted dataset") as tmp:
        tmp.mkdir()
        for rel, label, split, data, names, member in rows:
            where = src.where(member)
            if rel in seen:
                raise InputError(f"{where}: gives the output name {rel!r}, as {src.where(seen[rel])} does; "
                                 "two images would share one file, nothing was written")
            seen[rel] = member
            out = _inside(tmp, rel, where)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
            paths.append(rel)
            labels.append(label)
            splits.append(split)
            class_names = names
        if not paths:
            raise InputError(f"{source} holds no images in the {fmt} format")
        m = Manifest(paths, labels, split=None if splits[0] is None else splits, class_names=class_names,
                     root=tmp, name=target.name)  # fmt: skip
        (tmp / "manifest.csv").write_text(m.to_csv_text(relative_to=Path(os.path.abspath(tmp))))
    return target
