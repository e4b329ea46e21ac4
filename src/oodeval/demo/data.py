"""The demo benchmark, built offline and deterministically from data shipped with packages.

ID = Fashion-MNIST restricted to six classes (:data:`ID_CLASSES`), near-OOD = the four held-out
Fashion-MNIST classes of the test split (:data:`NEAR_OOD_CLASSES`; OOD from inside the same
collection, the demo's analogue of Fi-ImageNet-1k), far-OOD = scikit-learn's bundled digits
(8x8, resized to 20x20 and centred in 28x28 as MNIST does), 28x28 grey crops of scikit-image's
bundled photos, uniform noise and Gaussian noise with the ID-train pixel mean and std.

Each set is a normal user dataset: ``<data_root>/<name>/manifest.csv`` with PNG paths relative
to that folder (columns ``path,label,ood_label``) plus ``build.json`` recording the build spec
hash and the content hash of the pixels. A set whose ``build.json`` carries the same spec hash
(sizes, seed, source-file hashes, builder version) is skipped.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .._io import atomic_folder, hash_arrays, hash_json
from ..data import Manifest, open_image, read_idx
from ..errors import InputError

__all__ = [
    "FASHION_MNIST_DIR",
    "FASHION_MNIST_CLASSES",
    "ID_CLASSES",
    "NEAR_OOD_CLASSES",
    "PHOTOS",
    "SET_NAMES",
    "OOD_SETS",
    "DemoSizes",
    "load_fashion_mnist",
    "build_benchmark",
    "read_set",
]

BUILDER_VERSION = 2

#: Debian package ``dataset-fashion-mnist`` installs the four gzipped IDX files here.
FASHION_MNIST_DIR = Path(os.environ.get("OODEVAL_FASHION_MNIST", "/usr/share/datasets/fashion-mnist"))

FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)  # fmt: skip

#: ID classes (Fashion-MNIST indices); the model's class k is ``ID_CLASSES[k]``.
ID_CLASSES = (0, 1, 3, 5, 8, 9)
#: Held-out classes, each a near neighbour of an ID class (Pullover/Coat/Shirt ~ T-shirt/top and
#: Dress; Sneaker ~ Sandal and Ankle boot): hard, same-collection OOD.
NEAR_OOD_CLASSES = (2, 4, 6, 7)

#: scikit-image photos bundled inside the wheel (no download needed).
PHOTOS = (
    "camera", "astronaut", "coffee", "chelsea", "rocket", "coins", "moon", "page",
    "text", "clock", "brick", "grass", "gravel", "hubble_deep_field", "immunohistochemistry",
)  # fmt: skip

#: data-root folder names, in build order.
SET_NAMES = {
    "id_train": "demo-fmnist6-train",
    "id_test": "demo-fmnist6-test",
    "near_ood": "demo-fmnist-heldout",
    "digits": "demo-digits",
    "photos": "demo-photos",
    "uniform": "demo-noise-uniform",
    "gaussian": "demo-noise-gaussian",
}
#: the OOD sets and their kind (near / far).
OOD_SETS = {
    "demo-fmnist-heldout": "near",
    "demo-digits": "far",
    "demo-photos": "far",
    "demo-noise-uniform": "far",
    "demo-noise-gaussian": "far",
}

SIZE = 28


@dataclass(frozen=True)
class DemoSizes:
    """How many images each set gets (ID-train/test and near-OOD are drawn class-stratified)."""

    id_train: int = 12000
    id_test: int = 6000
    near_ood: int = 4000
    digits: int = 1797
    photos: int = 2000
    uniform: int = 1000
    gaussian: int = 1000

    @classmethod
    def quick(cls) -> DemoSizes:
        """The reduced sizes used by ``oodeval demo --quick`` and the tests."""
        return cls(id_train=1200, id_test=300, near_ood=200, digits=150, photos=150, uniform=100, gaussian=100)

    def __post_init__(self) -> None:
        bad = {k: v for k, v in asdict(self).items() if not isinstance(v, int) or v < 1}
        if bad:
            raise InputError(f"every demo set needs at least 1 image; got {bad}")


def _fmnist_files(root: Path) -> dict[str, Path]:
    files = {
        "train_images": root / "train-images-idx3-ubyte.gz",
        "train_labels": root / "train-labels-idx1-ubyte.gz",
        "test_images": root / "t10k-images-idx3-ubyte.gz",
        "test_labels": root / "t10k-labels-idx1-ubyte.gz",
    }
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise FileNotFoundError(
            f"Fashion-MNIST not found: {len(missing)} of 4 IDX files missing ({', '.join(missing)}); "
            "install the Debian package dataset-fashion-mnist or set OODEVAL_FASHION_MNIST"
        )
    return files


def load_fashion_mnist(root: str | Path | None = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{"train": (images (60000, 28, 28) uint8, labels (60000,) int64), "test": (10000 ...)}``."""
    files = _fmnist_files(Path(root) if root else FASHION_MNIST_DIR)
    out = {}
    for split in ("train", "test"):
        images = read_idx(str(files[f"{split}_images"]))
        labels = read_idx(str(files[f"{split}_labels"])).astype(np.int64)
        if images.shape[0] != labels.shape[0] or images.shape[1:] != (SIZE, SIZE):
            raise InputError(f"Fashion-MNIST {split}: {images.shape} images for {labels.shape} labels")
        out[split] = (images.astype(np.uint8), labels)
    return out


def _file_digest(path: Path) -> str:
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _stratified(labels: np.ndarray, classes: tuple[int, ...], n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` indices with labels in ``classes``, as equal per class as possible, sorted."""
    pools = [np.flatnonzero(labels == c) for c in classes]
    total = sum(len(p) for p in pools)
    if n > total:
        raise InputError(f"asked for {n} images of classes {classes} but only {total} exist")
    share = np.full(len(classes), n // len(classes))
    share[: n % len(classes)] += 1
    if any(s > len(p) for s, p in zip(share, pools)):
        raise InputError(f"class-stratified draw of {n} exceeds a class's {min(map(len, pools))} images")
    idx = [rng.choice(p, size=s, replace=False) for p, s in zip(pools, share)]
    return np.sort(np.concatenate(idx))


def _digits(n: int, rng: np.random.Generator) -> tuple[np.ndarray, list[str]]:
    """scikit-learn's 1,797 8x8 digits (0..16), scaled to 0..255, resized to 20x20 (bilinear,
    anti-aliased) and centred in a black 28x28 frame as MNIST centres its digits."""
    from skimage.transform import resize
    from sklearn.datasets import load_digits

    d = load_digits()
    if n > len(d.images):
        raise InputError(f"asked for {n} digits but scikit-learn bundles {len(d.images)}")
    idx = np.sort(rng.choice(len(d.images), size=n, replace=False))
    out = np.zeros((n, SIZE, SIZE), dtype=np.uint8)
    for i, j in enumerate(idx):
        small = resize(d.images[j] / 16.0, (20, 20), order=1, anti_aliasing=True, mode="edge")
        out[i, 4:24, 4:24] = np.clip(np.rint(small * 255), 0, 255).astype(np.uint8)
    return out, [f"digit {int(d.target[j])}" for j in idx]


def _photos(n: int, rng: np.random.Generator) -> tuple[np.ndarray, list[str]]:
    """Grey crops of scikit-image's bundled photos: photo ``i % len(PHOTOS)``, a random square of
    side 28..112 px (bounded by the photo) at a random place, resized to 28x28 with anti-aliasing."""
    import skimage.data
    from skimage.color import rgb2gray, rgba2rgb
    from skimage.transform import resize

    greys = []
    for name in PHOTOS:
        img = getattr(skimage.data, name)()
        if img.ndim == 3 and img.shape[2] == 4:
            img = rgba2rgb(img)
        grey = rgb2gray(img) if img.ndim == 3 else img.astype(np.float64) / (255.0 if img.dtype == np.uint8 else 1.0)
        greys.append(np.asarray(grey, dtype=np.float64))
    out = np.zeros((n, SIZE, SIZE), dtype=np.uint8)
    names = []
    for i in range(n):
        k = i % len(PHOTOS)
        g = greys[k]
        side = int(rng.integers(SIZE, min(112, *g.shape) + 1))
        r = int(rng.integers(0, g.shape[0] - side + 1))
        c = int(rng.integers(0, g.shape[1] - side + 1))
        crop = resize(g[r : r + side, c : c + side], (SIZE, SIZE), order=1, anti_aliasing=True, mode="edge")
        out[i] = np.clip(np.rint(crop * 255), 0, 255).astype(np.uint8)
        names.append(f"photo {PHOTOS[k]}")
    return out, names


def _uniform(n: int, rng: np.random.Generator) -> np.ndarray:
    """Every pixel uniform on 0..255."""
    return rng.integers(0, 256, size=(n, SIZE, SIZE), dtype=np.uint8)


def _gaussian(n: int, rng: np.random.Generator, mean: float, std: float) -> np.ndarray:
    """Every pixel N(mean, std^2) (the ID-train pixel moments), rounded and clipped to 0..255."""
    return np.clip(np.rint(rng.normal(mean, std, size=(n, SIZE, SIZE))), 0, 255).astype(np.uint8)


def _encode_png(img: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img, mode="L").save(buf, format="PNG", optimize=False)
    return buf.getvalue()


def _write_set(
    folder: Path, images: np.ndarray, labels: np.ndarray, ood_labels: list[str] | None, class_names: list[str] | None, spec: dict
) -> None:
    """Write PNGs + manifest.csv (through :class:`oodeval.data.Manifest`) + build.json atomically."""
    with atomic_folder(folder, "demo set") as tmp:
        (tmp / "images").mkdir(parents=True)
        paths = []
        for i, img in enumerate(images):
            rel = f"images/{i:06d}.png"
            (tmp / rel).write_bytes(_encode_png(img))
            paths.append(rel)
        Manifest(paths, labels, ood_label=ood_labels, class_names=class_names, name=spec["name"]).to_csv(tmp / "manifest.csv")
        build = dict(spec, n=len(images), content_hash=hash_arrays({"images": images, "labels": labels}))
        (tmp / "build.json").write_text(json.dumps(build, indent=2, sort_keys=True) + "\n")


def _is_built(folder: Path, spec_hash: str) -> bool:
    try:
        build = json.loads((folder / "build.json").read_text())
    except (OSError, ValueError):
        return False
    return build.get("spec_hash") == spec_hash and (folder / "manifest.csv").is_file()


def build_benchmark(
    data_root: str | Path,
    sizes: DemoSizes | None = None,
    seed: int = 0,
    fashion_mnist: str | Path | None = None,
    progress: bool = True,
) -> dict[str, Path]:
    """Build (or reuse) the seven demo sets under ``data_root`` and return role -> folder.

    Roles: ``id_train``, ``id_test``, ``near_ood``, ``digits``, ``photos``, ``uniform``,
    ``gaussian`` (folder names in :data:`SET_NAMES`). ID labels are 0..5 = positions in
    :data:`ID_CLASSES`; OOD labels are -1 with ``ood_label`` naming the source class or photo.
    Each set draws from its own generator seeded by (``seed``, role), so sizes of one set
    never change another. Sets already built with the same spec are skipped.
    """
    from tqdm.auto import tqdm

    sizes = sizes or DemoSizes()
    root = Path(data_root)
    fm_root = Path(fashion_mnist) if fashion_mnist else FASHION_MNIST_DIR
    sources = {k: _file_digest(p) for k, p in _fmnist_files(fm_root).items()}
    base = {"builder": BUILDER_VERSION, "seed": seed, "sizes": asdict(sizes), "fashion_mnist": sources}
    roles = list(SET_NAMES)
    specs = {role: dict(base, role=role, name=SET_NAMES[role]) for role in roles}
    for spec in specs.values():
        spec["spec_hash"] = hash_json({k: v for k, v in spec.items() if k != "spec_hash"})
    todo = [r for r in roles if not _is_built(root / SET_NAMES[r], specs[r]["spec_hash"])]
    out = {r: root / SET_NAMES[r] for r in roles}
    if not todo:
        return out

    fm = load_fashion_mnist(fm_root)
    names = [FASHION_MNIST_CLASSES[c] for c in ID_CLASSES]
    remap = np.full(10, -1, dtype=np.int64)
    remap[list(ID_CLASSES)] = np.arange(len(ID_CLASSES))

    def rng_for(role: str) -> np.random.Generator:
        return np.random.default_rng([seed, roles.index(role)])

    # every Fashion-MNIST draw first, so impossible sizes fail before anything is written
    fm_idx = {
        "id_train": _stratified(fm["train"][1], ID_CLASSES, sizes.id_train, rng_for("id_train")),
        "id_test": _stratified(fm["test"][1], ID_CLASSES, sizes.id_test, rng_for("id_test")),
        "near_ood": _stratified(fm["test"][1], NEAR_OOD_CLASSES, sizes.near_ood, rng_for("near_ood")),
    }
    train_px = fm["train"][0][fm_idx["id_train"]]
    pixel_mean, pixel_std = float(train_px.mean()), float(train_px.std())

    def make(role: str) -> tuple[np.ndarray, np.ndarray, list[str] | None]:
        rng = rng_for(role)
        n = getattr(sizes, role)
        if role in fm_idx:
            images, labels = fm["train" if role == "id_train" else "test"]
            idx = fm_idx[role]
            if role == "near_ood":
                return images[idx], np.full(n, -1, dtype=np.int64), [FASHION_MNIST_CLASSES[c] for c in labels[idx]]
            return images[idx], remap[labels[idx]], None
        makers: dict[str, Callable[[], tuple[np.ndarray, list[str]]]] = {
            "digits": lambda: _digits(n, rng),
            "photos": lambda: _photos(n, rng),
            "uniform": lambda: (_uniform(n, rng), ["uniform noise"] * n),
            "gaussian": lambda: (_gaussian(n, rng, pixel_mean, pixel_std), ["gaussian noise"] * n),
        }
        images, ood = makers[role]()
        return images, np.full(n, -1, dtype=np.int64), ood

    for role in tqdm(todo, desc="demo data", unit="set", disable=not progress):
        images, labels, ood = make(role)
        spec = dict(specs[role], pixel_mean=pixel_mean, pixel_std=pixel_std)
        class_names = names if role.startswith("id_") else None
        if class_names:
            spec["class_names"] = class_names
        _write_set(out[role], images, labels, ood, class_names, spec)
    return out


def read_set(folder: str | Path) -> tuple[np.ndarray, np.ndarray, dict]:
    """Read a built set back: (images (N, 28, 28) uint8, labels (N,) int64, build.json dict),
    decoded by :func:`oodeval.data.open_image` in mode "L" as extraction decodes them."""
    folder = Path(folder)
    build_file = folder / "build.json"
    if not build_file.is_file():
        raise FileNotFoundError(f"{folder} is not a built demo set (no build.json)")
    build = json.loads(build_file.read_text())
    manifest = Manifest.from_csv(folder / "manifest.csv")
    if len(manifest) != build["n"]:
        raise InputError(f"{folder}: manifest has {len(manifest)} rows but build.json records {build['n']}")
    images = np.stack([np.asarray(open_image(manifest.resolve_path(i), "L")) for i in range(len(manifest))])
    return images, manifest.labels, build
