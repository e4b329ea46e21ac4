"""OpenOOD's data as it lies: its image lists (``benchmark_imglist/<benchmark>/*.txt``) and its
v1.5 benchmarks (CIFAR-10, CIFAR-100, ImageNet-200, ImageNet-1K) with their near-OOD and far-OOD groups.

An OpenOOD data root holds ``benchmark_imglist/<benchmark>/<split>_<dataset>.txt`` and the images
under ``images_classic/`` (CIFAR-scale) or ``images_largescale/`` (ImageNet-scale). Each list line
is ``<path relative to the images folder> <label>`` (OpenOOD's ``ImglistDataset`` splits it at
the first space; a label that is not an integer, e.g. a JSON dict of extras, is not read). A list
of the benchmark's own dataset (``test_cifar10.txt`` under ``cifar10/``) is ID and keeps its
labels; every other list (``test_svhn.txt``) is OOD, its labels -1. :func:`oodeval.data.resolve`
reads such a ``.txt`` directly, so an experiment names the lists as its datasets
(:func:`experiment_datasets` writes that table for a benchmark). docs/extraction.md
("OpenOOD's data") shows the layout.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import InputError, UnknownNameError
from .manifest import Manifest

__all__ = ["read_imglist", "BENCHMARKS", "experiment_datasets", "IMAGE_FOLDERS", "LAYOUT"]

#: where OpenOOD keeps the images its lists point into, under the data root
IMAGE_FOLDERS = ("images_classic", "images_largescale")

#: OpenOOD v1.5 benchmarks (``openood/evaluation_api/datasets.py``, ``DATA_INFO``): list files
#: under ``benchmark_imglist/<benchmark>/`` for ID train / val / test, each OOD group (near, far),
#: the OOD validation list (``ood_val``, for hyperparameter search) and the covariate-shifted ID
#: lists (``csid``: ImageNet-V2/-C/-R(/-ES); OpenOOD adds them to the ID side in its full-spectrum
#: mode only and reports no group for them; :func:`experiment_datasets` adds them with ``full_spectrum``)
_CIFAR_FAR = {"mnist": "test_mnist.txt", "svhn": "test_svhn.txt", "texture": "test_texture.txt", "places365": "test_places365.txt"}
_IMAGENET_NEAR = {"ssb_hard": "test_ssb_hard.txt", "ninco": "test_ninco.txt"}
_IMAGENET_FAR = {"inaturalist": "test_inaturalist.txt", "textures": "test_textures.txt", "openimage_o": "test_openimage_o.txt"}
BENCHMARKS: dict[str, dict] = {
    "cifar10": {
        "id_train": "train_cifar10.txt", "id_val": "val_cifar10.txt", "id_test": "test_cifar10.txt", "ood_val": "val_tin.txt",
        "near": {"cifar100": "test_cifar100.txt", "tin": "test_tin.txt"}, "far": _CIFAR_FAR,
        "csid": {"cifar10c": "test_cifar10c.txt"},
    },
    "cifar100": {
        "id_train": "train_cifar100.txt", "id_val": "val_cifar100.txt", "id_test": "test_cifar100.txt", "ood_val": "val_tin.txt",
        "near": {"cifar10": "test_cifar10.txt", "tin": "test_tin.txt"}, "far": _CIFAR_FAR, "csid": {},
    },
    "imagenet200": {
        "id_train": "train_imagenet200.txt", "id_val": "val_imagenet200.txt", "id_test": "test_imagenet200.txt",
        "ood_val": "val_openimage_o.txt", "near": _IMAGENET_NEAR, "far": _IMAGENET_FAR,
        "csid": {"imagenet_v2": "test_imagenet200_v2.txt", "imagenet_c": "test_imagenet200_c.txt", "imagenet_r": "test_imagenet200_r.txt"},
    },
    "imagenet": {
        "id_train": "train_imagenet.txt", "id_val": "val_imagenet.txt", "id_test": "test_imagenet.txt",
        "ood_val": "val_openimage_o.txt", "near": _IMAGENET_NEAR, "far": _IMAGENET_FAR,
        "csid": {"imagenet_v2": "test_imagenet_v2.txt", "imagenet_c": "test_imagenet_c.txt", "imagenet_r": "test_imagenet_r.txt",
                 "imagenet_es": "test_imagenet_es.txt"},
    },
}  # fmt: skip
#: the layout an OpenOOD data root has (its ``scripts/download/download.py`` writes it), shown in errors
LAYOUT = ("<root>/benchmark_imglist/<benchmark>/<split>_<dataset>.txt ('<path> <label>' lines) and the images they name "
          "under <root>/images_classic/ (CIFAR-scale sets, Textures) or <root>/images_largescale/ (ImageNet-scale sets)")


def _images_root(list_file: Path, first: str) -> Path:
    """The images folder of an OpenOOD list: <root>/images_classic or images_largescale, whichever
    holds the list's first image (<root> = the folder above ``benchmark_imglist``)."""
    parts = list_file.resolve().parts
    if "benchmark_imglist" not in parts:
        raise InputError(f"OpenOOD image list {list_file} is not under a benchmark_imglist/ folder; give images_root")
    root = Path(*parts[: len(parts) - 1 - parts[::-1].index("benchmark_imglist")])
    for sub in IMAGE_FOLDERS:
        if (root / sub / first).is_file():
            return root / sub
    raise FileNotFoundError(
        f"OpenOOD image list {list_file}: its first image {first} is under none of "
        + ", ".join(str(root / s) for s in IMAGE_FOLDERS)
    )


def read_imglist(list_file: str | Path, images_root: str | Path | None = None, *, name: str | None = None) -> Manifest:
    """A Manifest of one OpenOOD image list: ``path label`` lines, paths relative to
    ``images_root`` (default: found as :func:`_images_root` says). ID (the list's dataset is its
    benchmark folder's, or one of its covariate-shifted ID lists) keeps integer labels; OOD gets -1. Bad lines raise ValueError naming the
    file and line."""
    list_file = Path(list_file)
    if not list_file.is_file():
        raise FileNotFoundError(f"OpenOOD image list {list_file} does not exist")
    try:
        lines = list_file.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise InputError(f"OpenOOD image list {list_file} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from exc
    paths, labels = [], []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        path, _, extra = line.strip().partition(" ")
        try:
            labels.append(int(extra.strip()))
        except ValueError:
            raise InputError(f"OpenOOD image list {list_file} line {i}: expected '<path> <integer label>', got {line!r}") from None
        paths.append(path)
    if not paths:
        raise InputError(f"OpenOOD image list {list_file} has no lines")
    benchmark = list_file.parent.name
    csid_lists = set(BENCHMARKS.get(benchmark, {}).get("csid", {}).values())
    is_id = list_file.stem.split("_", 1)[-1] == benchmark or list_file.name in csid_lists
    root = Path(images_root) if images_root is not None else _images_root(list_file, paths[0])
    label = np.array(labels) if is_id else np.full(len(paths), -1)
    if is_id and (label < 0).any():
        raise InputError(f"OpenOOD image list {list_file}: {int((label < 0).sum())} ID rows have a negative label")
    return Manifest(paths, label, root=root, name=name or f"{benchmark}/{list_file.stem}", meta={"openood_list": str(list_file)})


def experiment_datasets(data_root: str | Path, benchmark: str, full_spectrum: bool = False) -> dict:
    """The ``[datasets]`` table of an experiment on OpenOOD v1.5 benchmark ``benchmark`` under
    ``data_root``: ID train / test lists and every OOD list, labelled by OpenOOD's dataset name,
    grouped ``near`` / ``far`` (the report shows each group's mean); with ``full_spectrum`` also the
    benchmark's covariate-shifted ID lists as ``csid`` (OpenOOD v1.5's FSOOD mode; refused for a
    benchmark that has none). A missing list file is a FileNotFoundError naming every missing file
    and the expected layout."""
    if benchmark not in BENCHMARKS:
        raise UnknownNameError(f"unknown OpenOOD benchmark {benchmark!r}; known: {', '.join(BENCHMARKS)}")
    spec = BENCHMARKS[benchmark]
    lists = Path(data_root) / "benchmark_imglist" / benchmark
    ood = [{"name": str(lists / f), "label": n, "group": g} for g in ("near", "far") for n, f in spec[g].items()]
    out = {"id_train": str(lists / spec["id_train"]), "id_test": str(lists / spec["id_test"]), "ood": ood}
    if full_spectrum:
        if not spec["csid"]:
            raise InputError(f"OpenOOD benchmark {benchmark!r} has no covariate-shifted ID lists; full_spectrum needs one of "
                             f"{', '.join(b for b, v in BENCHMARKS.items() if v['csid'])}")
        out["csid"] = [{"name": str(lists / f), "label": n} for n, f in spec["csid"].items()]
    if not lists.is_dir():
        raise FileNotFoundError(f"OpenOOD benchmark {benchmark!r}: {lists} does not exist; expected {LAYOUT}")
    missing = [p for p in (out["id_train"], out["id_test"], *(d["name"] for d in ood + out.get("csid", []))) if not Path(p).is_file()]
    if missing:
        raise FileNotFoundError(f"OpenOOD benchmark {benchmark!r} under {data_root}: {len(missing)} image list(s) missing: "
                                f"{', '.join(missing)}; expected {LAYOUT}")
    return out
