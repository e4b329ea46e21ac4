"""The inputs of every training step, built in DataLoader workers.

Item ``t`` of :class:`StepBatches` is step ``t`` of one epoch: the ID batch (after the ID
augmentation) and, for CnC, as many synthetic outliers. Every random draw of a step comes from
generators seeded by (seed, epoch, step) alone: ``[seed, epoch]`` orders the ID images,
``[seed, epoch, 2]`` the outlier sources (``outlier_pairing="shuffled"``, the release's separate
shuffled loader; ``"same"`` builds the outliers on the ID batch), ``[seed, epoch, step, 1]``
augments the ID batch and ``[seed, epoch, step]`` (:func:`~oodeval.cnc.cutmix.step_rng`) draws the
outliers. Each worker therefore builds its steps with its own generators and the batches are
identical for any number of workers (0 = in the main process) and on resume.
"""

from __future__ import annotations

import numpy as np
import torch

from .augment import AUGMENTS, release_source
from .tensors import to_tensor

__all__ = ["StepBatches", "step_loader"]


class StepBatches:
    """Map-style dataset of whole training steps: ``{"x", "y"[, "outliers"]}`` as torch tensors."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, config, epoch: int) -> None:
        self.images, self.labels, self.config, self.epoch = images, labels, config, epoch
        n, bs = len(images), config.batch_size
        self.order = np.random.default_rng([config.seed, epoch]).permutation(n)
        pairing = config.outlier_pairing
        self.sources = np.random.default_rng([config.seed, epoch, 2]).permutation(n) if pairing == "shuffled" else self.order
        self.starts = [s for s in range(0, n, bs) if n - s >= 2]

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, t: int) -> dict:
        from .cutmix import compound, step_rng

        cfg = self.config
        start = self.starts[t]
        idx = self.order[start : start + cfg.batch_size]
        x = self.images[idx]
        aug = AUGMENTS[cfg.augment]
        if aug is not None:
            x = aug(x, np.random.default_rng([cfg.seed, self.epoch, t, 1]))
        item = {"x": to_tensor(x, cfg.mean, cfg.std), "y": torch.from_numpy(self.labels[idx])}
        if cfg.cnc:
            src = self.sources[start : start + cfg.batch_size]
            syn, _ = compound(
                self.images, self.labels, src, step_rng(cfg.seed, self.epoch, t), cfg.corruptions,
                placement=cfg.placement, preset=cfg.severity,
                transform=release_source if cfg.outlier_augment == "release" else None,
            )  # fmt: skip
            item["outliers"] = to_tensor(syn, cfg.mean, cfg.std)
        return item


def _worker_init(_: int) -> None:
    torch.set_num_threads(1)


def step_loader(images: np.ndarray, labels: np.ndarray, config, epoch: int, workers: int = 0, pin_memory: bool = False):
    """A DataLoader over :class:`StepBatches` (one item = one step, in step order)."""
    ds = StepBatches(images, labels, config, epoch)
    return torch.utils.data.DataLoader(
        ds, batch_size=None, shuffle=False, num_workers=workers, pin_memory=pin_memory,
        worker_init_fn=_worker_init if workers else None, prefetch_factor=4 if workers else None,
        generator=torch.Generator().manual_seed(config.seed),
    )  # fmt: skip
