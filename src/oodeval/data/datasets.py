"""Named benchmarks: where each dataset lies under the data root, how many images it has, its role.

The data root is ``--data-root DIR`` or the environment variable ``OODEVAL_DATA``. Dataset NAME
lives in ``<data_root>/NAME/`` in the layout its spec documents; a ``manifest.csv`` in that folder
(columns path,label[,ood_label,fine_grained,split]; paths relative to the folder) overrides the
layout. Any other folder ``<data_root>/NAME/manifest.csv`` is a user dataset. Nothing else is
guessed. Counts are those of the Fi-ImageNet-1k paper (Tab. 3 and A3) and the usual CIFAR suite.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InputError
from .images import read_idx
from .manifest import IMAGE_EXTENSIONS, Manifest, list_images
from .openood import read_imglist

__all__ = ["DatasetSpec", "REGISTRY", "DEBIAN_FASHION_MNIST", "default_data_root", "resolve", "status", "register_dataset"]

#: where Debian's ``dataset-fashion-mnist`` package installs the IDX files.
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")

FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


@dataclass(frozen=True)
class DatasetSpec:
    """One named dataset: role (``id``/``ood``), expected image count, layout text, source, loader."""

    name: str
    role: str
    count: int | None
    layout: str
    source: str
    loader: Callable[[Path, DatasetSpec], Manifest] = field(repr=False, compare=False)
    splits: dict[str, int] | None = None
    folder: str | None = None

    @property
    def dirname(self) -> str:
        return self.folder or self.name

    def describe(self) -> str:
        """Expected layout and count, as shown in errors and by ``oodeval datasets``."""
        count = "unknown" if self.count is None else f"{self.count:,}"
        if self.splits:
            count += " (" + ", ".join(f"{k} {v:,}" for k, v in self.splits.items()) + ")"
        return (
            f"{self.name} ({self.role}; expected images: {count}; source: {self.source})\n"
            f"  expected layout under the data root:\n    " + self.layout.replace("\n", "\n    ")
        )


REGISTRY: dict[str, DatasetSpec] = {}


def register_dataset(spec: DatasetSpec) -> DatasetSpec:
    """Add ``spec`` to :data:`REGISTRY` (names are unique)."""
    if spec.name in REGISTRY:
        raise InputError(f"dataset {spec.name!r} is already registered")
    REGISTRY[spec.name] = spec
    return spec


def default_data_root(path: str | os.PathLike | None = None) -> Path | None:
    """The data root: ``path`` if given, else ``$OODEVAL_DATA``, else None."""
    if path is not None:
        return Path(path).expanduser()
    env = os.environ.get("OODEVAL_DATA")
    return Path(env).expanduser() if env else None


# ---------------------------------------------------------------------- loaders
def _ood_folder(folder: Path, spec: DatasetSpec) -> Manifest:
    return Manifest.from_image_folder(folder, name=spec.name, labelled=False)


def _split_folders(labelled: bool, classes: int | None = None) -> Callable[[Path, DatasetSpec], Manifest]:
    """``<folder>/<split>/<class>/<image>`` (labelled) or ``<folder>/<split>/**/<image>``."""

    def load(folder: Path, spec: DatasetSpec) -> Manifest:
        parts = []
        names = None
        for split in spec.splits or {}:
            sub = folder / split
            if not sub.is_dir():
                continue
            m = Manifest.from_image_folder(sub, name=spec.name, labelled=labelled)
            if labelled:
                if classes is not None and len(m.class_names or []) != classes:
                    raise InputError(f"{sub} has {len(m.class_names or [])} class folders, expected {classes}")
                if names is not None and m.class_names != names:
                    odd = sorted(set(m.class_names or []) ^ set(names))
                    raise InputError(f"{folder}: the splits have different class folders "
                                     f"({len(odd)} class folders lie in only one split, e.g. {odd[:3]})")
                names = m.class_names
            m.paths = [f"{split}/{p}" for p in m.paths]
            m.split = [split] * len(m)
            parts.append(m)
        if not parts:
            raise FileNotFoundError(f"{folder} has none of the split folders {', '.join(spec.splits or {})}")
        has_ood = not labelled and any(m.ood_label is not None for m in parts)
        return Manifest(
            [p for m in parts for p in m.paths],
            np.concatenate([m.labels for m in parts]),
            ood_label=[x for m in parts for x in (m.ood_label or [""] * len(m))] if has_ood else None,
            split=[s for m in parts for s in m.split or []],
            class_names=names,
            root=folder,
            name=spec.name,
        )

    return load


def _imagenet_synsets() -> list[str]:
    """The 1000 ImageNet-1k wnids in label order (sorted), from the list timm ships (without importing timm)."""
    import importlib.util

    spec = importlib.util.find_spec("timm")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("timm is not installed; its imagenet_synsets.txt gives the ImageNet-1k label order")
    wnids = (Path(spec.submodule_search_locations[0]) / "data" / "_info" / "imagenet_synsets.txt").read_text().split()
    if len(wnids) != 1000:
        raise InputError(f"timm's imagenet_synsets.txt lists {len(wnids)} wnids, expected 1000")
    return wnids


def _imagenet_val(folder: Path, spec: DatasetSpec) -> Manifest:
    """ImageNet-1k: wnid sub-folders, or flat images with LOC_val_solution.csv or val.txt (sorted-wnid index)."""
    wnids = _imagenet_synsets()
    index = {w: i for i, w in enumerate(wnids)}
    subdirs = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if subdirs and all(s in index for s in subdirs):
        m = Manifest.from_image_folder(folder, name=spec.name)
        labels = np.array([index[(m.class_names or [])[k]] for k in m.labels])
        return Manifest(m.paths, labels, class_names=wnids, root=folder, name=spec.name)
    files = {p.name: p.relative_to(folder).as_posix() for p in list_images(folder)}
    stem = {Path(k).stem: v for k, v in files.items()}
    if (folder / "LOC_val_solution.csv").is_file():
        with open(folder / "LOC_val_solution.csv", newline="") as fh:
            rows = {r["ImageId"]: index[r["PredictionString"].split()[0]] for r in csv.DictReader(fh)}
        keys = sorted(k for k in rows if k in stem)
        return Manifest([stem[k] for k in keys], [rows[k] for k in keys], class_names=wnids, root=folder, name=spec.name)
    if (folder / "val.txt").is_file():
        pairs = [ln.split() for ln in (folder / "val.txt").read_text().splitlines() if ln.strip()]
        pairs = sorted((Path(p).name, int(lab)) for p, lab in pairs if Path(p).name in files)
        return Manifest([files[p] for p, _ in pairs], [lab for _, lab in pairs], class_names=wnids, root=folder, name=spec.name)
    raise FileNotFoundError(f"{folder}: neither 1000 wnid folders nor LOC_val_solution.csv / val.txt with flat images")


def _fashion_mnist(folder: Path, spec: DatasetSpec) -> Manifest:
    paths, labels, split = [], [], []
    for name, prefix in (("train", "train"), ("test", "t10k")):
        img = _first_existing(folder, f"{prefix}-images-idx3-ubyte")
        lab = _first_existing(folder, f"{prefix}-labels-idx1-ubyte")
        if img is None or lab is None:
            raise FileNotFoundError(f"{folder} lacks {prefix}-images-idx3-ubyte[.gz] or {prefix}-labels-idx1-ubyte[.gz]")
        y = read_idx(str(lab)).astype(np.int64)
        paths += [f"{img.name}#{k}" for k in range(len(y))]
        labels.append(y)
        split += [name] * len(y)
    return Manifest(paths, np.concatenate(labels), split=split, class_names=FASHION_MNIST_CLASSES, root=folder, name=spec.name)


def _first_existing(folder: Path, stem: str) -> Path | None:
    for cand in (folder / stem, folder / f"{stem}.gz"):
        if cand.is_file():
            return cand
    return None


def _manifest_only(folder: Path, spec: DatasetSpec) -> Manifest:
    raise FileNotFoundError(f"{folder / 'manifest.csv'} is missing; {spec.name} is read from its manifest only")


# ---------------------------------------------------------------------- the registry
_FLAT = "{name}/**/<image>   (any depth; a first sub-folder, if present, is kept as ood_label)"


def _ood(name: str, count: int | None, source: str, layout: str = _FLAT, folder: str | None = None) -> None:
    register_dataset(DatasetSpec(name, "ood", count, layout.format(name=folder or name), source, _ood_folder, folder=folder))


register_dataset(DatasetSpec(
    "imagenet1k-val", "id", 50_000,
    "imagenet1k-val/<wnid>/<image>.JPEG   (1000 wnid folders; label = index of the wnid in sorted order)\n"
    "or imagenet1k-val/<image>.JPEG with imagenet1k-val/LOC_val_solution.csv (Kaggle) or val.txt ('name index')",
    "ILSVRC2012 validation set", _imagenet_val))
register_dataset(DatasetSpec(
    "imagenet1k-train", "id", 1_281_167,
    "imagenet1k-train/<wnid>/<image>.JPEG   (1000 wnid folders; label = index of the wnid in sorted order)",
    "ILSVRC2012 training set (ID-train for fitting detectors)", _imagenet_val))
register_dataset(DatasetSpec(
    "fi-imagenet-1k", "ood", 655,
    "fi-imagenet-1k/manifest.csv   (path,label,ood_label,fine_grained; supplied with the dataset release)",
    "Fi-ImageNet-1k (this paper; manifest supplied by the user once released)", _manifest_only))
_ood("ninco", 5_879, "NINCO (Bitterwolf et al. 2023), the NINCO_OOD_classes folder",
     "ninco/<ood class>/<image>   (a copy or link of NINCO/NINCO_OOD_classes)")
_ood("imagenet-o", 2_000, "ImageNet-O (Hendrycks et al. 2021)")
_ood("openimage-o", 17_632, "OpenImage-O (Wang et al. 2022)")
_ood("inaturalist", 10_000, "iNaturalist OOD plants (Huang & Li 2021, MOS)")
_ood("textures", 5_640, "Describable Textures Dataset (Cimpoi et al. 2014)")
_ood("places", 10_000, "Places OOD subset (Huang & Li 2021, MOS)")
_ood("ssb-easy", 50_000, "Semantic Shift Benchmark, ImageNet easy split (Vaze et al. 2022)")
_ood("ssb-hard", 49_000, "Semantic Shift Benchmark, ImageNet hard split (Vaze et al. 2022)")
_ood("species", 10_000, "Species (Hendrycks et al. 2022), OOD subset")
_ood("in1k-ood", 50_000, "IN1k-OOD (Wang et al. 2023)")
_ood("imagenet-ood", 31_802, "ImageNet-OOD (Yang et al. 2023)")
_ood("360openset", 11_800, "360OpenSet")
_ood("cood", 10_350, "COOD")

#: NINCO's manually cleaned sub-samples of popular OOD sets (paper Tab. A3): name -> count.
NINCO_CLEAN = {
    "inaturalist": 383, "openimage-o": 368, "360openset": 236, "cood": 212, "imagenet-o": 309, "textures": 288,
    "places": 153, "ssb-easy": 151, "ssb-hard": 208, "species": 172, "in1k-ood": 235,
}
for _n, _c in NINCO_CLEAN.items():
    _ood(f"ninco-clean-{_n}", _c, f"NINCO's cleaned sub-sample of {_n} (NINCO_popular_datasets_subsamples)",
         "{name}/**/<image>", folder=f"ninco-clean/{_n}")
_ood("clean-ood", sum(NINCO_CLEAN.values()), "CLEAN-OOD: union of the 11 NINCO cleaned sub-samples (paper Tab. 3)",
     "ninco-clean/<dataset>/**/<image>   (the 11 ninco-clean-* folders; ood_label = dataset)", folder="ninco-clean")

_CIFAR = ("{name}/train/<class>/<image>.png and {name}/test/<class>/<image>.png   ({k} class folders, sorted = official "
          "label order; `oodeval datasets convert {name}` writes it from the python-version pickles)")
register_dataset(DatasetSpec("cifar10", "id", 60_000, _CIFAR.format(name="cifar10", k=10), "CIFAR-10 (Krizhevsky 2009)",
                             _split_folders(True, 10), splits={"train": 50_000, "test": 10_000}))
register_dataset(DatasetSpec("cifar100", "id", 60_000, _CIFAR.format(name="cifar100", k=100), "CIFAR-100 (Krizhevsky 2009)",
                             _split_folders(True, 100), splits={"train": 50_000, "test": 10_000}))
register_dataset(DatasetSpec(
    "svhn", "id", 99_289, "svhn/train/<digit>/<image>.png and svhn/test/<digit>/<image>.png   (10 digit folders 0-9; "
    "`oodeval datasets convert svhn` writes it from train_32x32.mat / test_32x32.mat)",
    "SVHN cropped digits (Netzer et al. 2011); svhn:test is the usual OOD set",
    _split_folders(True, 10), splits={"train": 73_257, "test": 26_032}))
register_dataset(DatasetSpec(
    "tinyimagenet", "id", 110_000, "tinyimagenet/train/<wnid>/<image>.JPEG and tinyimagenet/val/<wnid>/<image>.JPEG   "
    "(200 wnid folders, sorted = label order; `oodeval datasets convert tinyimagenet` writes it from tiny-imagenet-200.zip)",
    "Tiny-ImageNet (Le & Yang 2015), 64 x 64 px, 200 classes", _split_folders(True, 200),
    splits={"train": 100_000, "val": 10_000}))
_ODIN = "{name}/**/<image>   (`oodeval datasets convert odin` writes it from the ODIN archive)"
_ood("tin-crop", 10_000, "TinyImageNet crop (ODIN release, Liang et al. 2018)", _ODIN)
_ood("tin-resize", 10_000, "TinyImageNet resize (ODIN release, Liang et al. 2018)", _ODIN)
_ood("lsun-crop", 10_000, "LSUN crop (ODIN release, Liang et al. 2018)", _ODIN)
_ood("lsun-resize", 10_000, "LSUN resize (ODIN release, Liang et al. 2018)", _ODIN)
_ood("isun", 8_925, "iSUN (ODIN release, Liang et al. 2018)", _ODIN)
register_dataset(DatasetSpec(
    "fashion-mnist", "id", 70_000,
    "fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]   (IDX files);\n"
    f"without it, Debian's dataset-fashion-mnist package in {DEBIAN_FASHION_MNIST}",
    "Fashion-MNIST (Xiao et al. 2017), Debian package dataset-fashion-mnist", _fashion_mnist,
    splits={"train": 60_000, "test": 10_000}))


# ---------------------------------------------------------------------- resolution
def _folder_for(spec: DatasetSpec, root: Path | None) -> Path | None:
    if root is not None and (root / spec.dirname).exists():
        return root / spec.dirname
    if spec.name == "fashion-mnist" and DEBIAN_FASHION_MNIST.is_dir():
        return DEBIAN_FASHION_MNIST
    return None


def _expected_count(spec: DatasetSpec, m: Manifest) -> int | None:
    """The spec's count, or the sum over the splits present when the spec lists splits."""
    if spec.splits and m.split is not None:
        present = set(m.split)
        if present <= set(spec.splits):
            return sum(spec.splits[s] for s in present)
    return spec.count


def _load_spec(spec: DatasetSpec, root: Path | None, strict: bool) -> Manifest:
    folder = _folder_for(spec, root)
    if folder is None:
        where = f"{root / spec.dirname} does not exist" if root is not None else (
            "no data root given (pass --data-root DIR or set OODEVAL_DATA)")
        raise FileNotFoundError(f"dataset {spec.name!r} not found: {where}.\n{spec.describe()}")
    try:
        if (folder / "manifest.csv").is_file():
            m = Manifest.from_csv(folder / "manifest.csv", name=spec.name)
        else:
            m = spec.loader(folder, spec)
    except (FileNotFoundError, ValueError) as exc:
        raise type(exc)(f"dataset {spec.name!r} in {folder} is not laid out as expected: {exc}\n{spec.describe()}") from exc
    expected = _expected_count(spec, m)
    if strict and expected is not None and len(m) != expected:
        raise InputError(
            f"dataset {spec.name!r} in {folder}: found {len(m):,} images, expected {expected:,} "
            f"(pass strict=False / --no-strict to use it anyway).\n{spec.describe()}"
        )
    m.meta.update(registry=spec.name, role=spec.role)
    return m


def resolve(name_or_path: str | os.PathLike, data_root: str | os.PathLike | None = None, *, strict: bool = True) -> Manifest:
    """A Manifest for a registry name, a user dataset name, an image folder or a CSV manifest.

    Order: an existing CSV file (or OpenOOD ``.txt`` image list, :mod:`oodeval.data.openood`); an existing folder (its ``manifest.csv`` if present, else an
    ImageFolder tree, else an unlabelled image folder); ``NAME:SPLIT`` selects a split; a registry
    name; ``<data_root>/NAME/manifest.csv``. A registry dataset whose image count differs from the
    expected one raises ValueError unless ``strict=False``.
    """
    root = default_data_root(data_root)
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.is_file():
        if path.suffix.lower() == ".txt":  # an OpenOOD image list (benchmark_imglist/<benchmark>/*.txt)
            return read_imglist(path)
        if path.suffix.lower() != ".csv":
            raise InputError(f"{path} is a file but neither a .csv manifest nor an OpenOOD .txt image list")
        return Manifest.from_csv(path)
    if path.is_dir():
        if (path / "manifest.csv").is_file():
            return Manifest.from_csv(path / "manifest.csv")
        subdirs = [p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")]
        loose = [p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")]
        return Manifest.from_image_folder(path, labelled=bool(subdirs) and not any(
            p.suffix.lower() in IMAGE_EXTENSIONS for p in loose))
    if ":" in text and not path.exists():
        base, split = text.rsplit(":", 1)
        return resolve(base, root, strict=strict).select(split=split)
    if text in REGISTRY:
        return _load_spec(REGISTRY[text], root, strict)
    if root is not None and (root / text / "manifest.csv").is_file():
        return Manifest.from_csv(root / text / "manifest.csv", name=text)
    where = f"no folder {root / text} with a manifest.csv" if root is not None else "no data root given (--data-root / OODEVAL_DATA)"
    raise FileNotFoundError(
        f"unknown dataset {text!r}: not an existing path, not a registry name, and {where}. "
        f"Registry names: {', '.join(sorted(REGISTRY))}"
    )


def status(data_root: str | os.PathLike | None = None) -> list[dict]:
    """One row per registry dataset and per user dataset found: name, role, expected, found, state."""
    root = default_data_root(data_root)
    rows = []
    for spec in REGISTRY.values():
        row = {"name": spec.name, "role": spec.role, "expected": spec.count, "found": None, "state": "missing", "path": None}
        folder = _folder_for(spec, root)
        if folder is not None:
            row["path"] = str(folder)
            try:
                m = _load_spec(spec, root, strict=False)
                row["found"] = len(m)
                expected = _expected_count(spec, m)
                row["expected"] = expected
                row["state"] = "ok" if expected in (None, len(m)) else "count mismatch"
            except (FileNotFoundError, ValueError) as exc:
                row["state"] = "mis-laid: " + str(exc).splitlines()[0]
        rows.append(row)
    if root is not None and root.is_dir():
        taken = {REGISTRY[n].dirname.split("/")[0] for n in REGISTRY}
        for sub in sorted(root.iterdir()):
            if sub.name not in taken and (sub / "manifest.csv").is_file():
                try:
                    n = len(Manifest.from_csv(sub / "manifest.csv"))
                    state = "ok (user dataset)"
                except (FileNotFoundError, ValueError) as exc:
                    n, state = None, f"bad manifest: {exc}"
                rows.append({"name": sub.name, "role": "user", "expected": None, "found": n, "state": state, "path": str(sub)})
    return rows
