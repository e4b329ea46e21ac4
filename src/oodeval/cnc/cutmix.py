"""CnC synthetic outliers: CutMix of two images of different classes, then one corruption.

Hebbalaguppe et al., "A Novel Data Augmentation Technique for Out-of-Distribution Sample
Detection using Compounded Corruptions" (ECML-PKDD 2022, arXiv:2207.13916), Sec. 3:
for an ID image a with label y_a, draw b with y_b != y_a, lambda ~ Beta(1, 1), and paste the box
of b with sides (H sqrt(1 - lambda), W sqrt(1 - lambda)) into a (CutMix, Yun et al. 2019); then
apply one corruption drawn uniformly from the pool at a severity drawn uniformly from 1-5.
The synthetic image is labelled K (0-based), the (K+1)-th class.

Partner: ``b`` is uniform over the images of the other classes (the CnC code steps forward from
a random index until the class differs, which is uniform only for a class-shuffled dataset).
Box placement: ``"center"`` (default) draws the box centre uniformly over the image and clips the
box at the border, as CutMix's ``rand_bbox`` and the CnC code do, so a clipped box is smaller
than (1 - lambda) of the image; ``"inside"`` draws the top-left corner uniformly among the
positions where the whole box fits, so the pasted area is (1 - lambda) H W up to rounding.
Pool: the default is the CnC release's 15 (:data:`~oodeval.cnc.corruptions.RELEASE_POOL`,
``cnc-ood/cnc_ood`` ``augmentations/__init__.py``); ``BENCHMARK_15`` is the ImageNet-C benchmark
set and :data:`~oodeval.cnc.corruptions.CORRUPTIONS` all 19. The release draws one lambda and one
box per batch and pairs by a permutation of the batch; here each outlier draws its own (the
paper's per-sample description).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from .corruptions import BENCHMARK_15, CORRUPTIONS, DEFAULT_POOL, corrupt
from .tensors import to_tensor

__all__ = [
    "BENCHMARK_15", "Box", "cutmix_box", "cutmix", "different_class_partners", "compound",
    "OutlierBatch", "outlier_batches", "step_rng",
]  # fmt: skip

@dataclass(frozen=True)
class Box:
    """Rows ``top:bottom`` and columns ``left:right`` (half-open) of the pasted patch."""

    top: int
    left: int
    bottom: int
    right: int

    @property
    def area(self) -> int:
        return (self.bottom - self.top) * (self.right - self.left)


def cutmix_box(height: int, width: int, lam: float, rng: np.random.Generator, placement: str = "center") -> Box:
    """The CutMix box for mixing ratio ``lam``: sides int(H sqrt(1-lam)) x int(W sqrt(1-lam))."""
    if not 0.0 <= lam <= 1.0:
        raise InputError(f"lam must lie in [0, 1], got {lam}")
    cut = np.sqrt(1.0 - lam)
    ch, cw = int(height * cut), int(width * cut)
    if placement == "center":
        cy, cx = int(rng.integers(height)), int(rng.integers(width))
        top, bottom = np.clip([cy - ch // 2, cy + ch // 2], 0, height)
        left, right = np.clip([cx - cw // 2, cx + cw // 2], 0, width)
        return Box(int(top), int(left), int(bottom), int(right))
    if placement == "inside":
        top, left = int(rng.integers(height - ch + 1)), int(rng.integers(width - cw + 1))
        return Box(top, left, top + ch, left + cw)
    raise InputError(f"unknown placement {placement!r}; use 'center' or 'inside'")


def cutmix(a: np.ndarray, b: np.ndarray, box: Box) -> np.ndarray:
    """A copy of ``a`` with ``b``'s pixels inside ``box`` (same shapes required)."""
    if a.shape != b.shape:
        raise InputError(f"cutmix needs images of one shape, got {a.shape} and {b.shape}")
    out = a.copy()
    out[box.top : box.bottom, box.left : box.right] = b[box.top : box.bottom, box.left : box.right]
    return out


def different_class_partners(labels: np.ndarray, index: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """For each ``labels[index[i]]``, a uniformly drawn position j with ``labels[j] != labels[index[i]]``."""
    labels = np.asarray(labels)
    index = np.asarray(index)
    classes, inverse = np.unique(labels, return_inverse=True)
    if len(classes) < 2:
        raise InputError(f"CnC needs at least 2 classes to pair images of different classes, got {len(classes)}")
    order = np.argsort(inverse, kind="stable")
    counts = np.bincount(inverse, minlength=len(classes))
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    own = inverse[index]
    # draw uniformly among the n - count(own class) others: skip over the own class's block
    others = len(labels) - counts[own]
    r = (rng.random(len(index)) * others).astype(np.int64)
    r = np.where(r >= starts[own], r + counts[own], r)
    return order[r]


def compound(
    images: np.ndarray,
    labels: np.ndarray,
    index: np.ndarray,
    rng: np.random.Generator,
    corruptions: Sequence[str] = DEFAULT_POOL,
    severities: Sequence[int] = (1, 2, 3, 4, 5),
    beta: float = 1.0,
    placement: str = "center",
    preset: str = "auto",
    transform: Callable[[np.ndarray, np.random.Generator], np.ndarray] | None = None,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """CnC outliers built on ``images[index]``: uint8 (len(index), H, W[, C]) and a record.

    ``transform(image, rng)``: applied to both source images before the CutMix (the release's
    outlier-source augmentation, :func:`oodeval.cnc.augment.release_source`).

    The record holds per sample: ``first``, ``second`` (positions in ``images``), ``lam``,
    ``box`` (top, left, bottom, right), ``corruption`` (name) and ``severity``.
    """
    images = np.asarray(images)
    if images.dtype != np.uint8:
        raise InputError(f"compound expects uint8 images, got {images.dtype}")
    if len(images) != len(labels):
        raise InputError(f"{len(images)} images but {len(labels)} labels")
    unknown = [c for c in corruptions if c not in CORRUPTIONS]
    if unknown or not corruptions:
        raise InputError(f"unknown or empty corruption pool: {unknown or 'empty'}")
    index = np.asarray(index, dtype=np.int64)
    second = different_class_partners(labels, index, rng)
    lam = rng.beta(beta, beta, size=len(index))
    which = rng.integers(len(corruptions), size=len(index))
    sev = np.asarray(severities)[rng.integers(len(severities), size=len(index))]
    h, w = images.shape[1:3]
    out = np.empty((len(index),) + images.shape[1:], dtype=np.uint8)
    boxes = np.empty((len(index), 4), dtype=np.int64)
    for k, (i, j) in enumerate(zip(index, second)):
        box = cutmix_box(h, w, float(lam[k]), rng, placement)
        boxes[k] = (box.top, box.left, box.bottom, box.right)
        a, b = (images[i], images[j]) if transform is None else (transform(images[i], rng), transform(images[j], rng))
        out[k] = corrupt(cutmix(a, b, box), corruptions[which[k]], int(sev[k]), rng, preset)
    record = {
        "first": index,
        "second": second,
        "lam": lam,
        "box": boxes,
        "corruption": np.asarray([corruptions[c] for c in which]),
        "severity": sev,
    }
    return out, record


def step_rng(seed: int, epoch: int, step: int) -> np.random.Generator:
    """The generator of one training step: a function of (seed, epoch, step) only, so a resumed
    run draws exactly the outliers an uninterrupted run would."""
    return np.random.default_rng([seed, epoch, step])


@dataclass
class OutlierBatch:
    """One batch of CnC outliers as a float tensor (N, C, H, W) plus its record."""

    images: object  # torch.Tensor
    record: dict[str, np.ndarray]


def outlier_batches(
    images: np.ndarray,
    labels: np.ndarray,
    batch_size: int,
    seed: int,
    epoch: int = 0,
    corruptions: Sequence[str] = DEFAULT_POOL,
    mean: Sequence[float] = (0.5,),
    std: Sequence[float] = (0.5,),
    placement: str = "center",
) -> Iterator[OutlierBatch]:
    """Seeded stream of torch batches of CnC outliers built on a shuffled pass over ``images``.

    Step t of ``epoch`` uses :func:`step_rng` (seed, epoch, t): the same arguments give the same
    tensors. Pixels are scaled to [0, 1] and normalised per channel by ``mean`` / ``std``.
    """
    order = np.random.default_rng([seed, epoch]).permutation(len(images))
    for t, start in enumerate(range(0, len(order), batch_size)):
        rng = step_rng(seed, epoch, t)
        out, record = compound(images, labels, order[start : start + batch_size], rng, corruptions, placement=placement)
        yield OutlierBatch(to_tensor(out, mean, std), record)
