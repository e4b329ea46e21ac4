"""Linear probe: one linear layer trained with cross-entropy on cached ID-train features.

Gives frozen encoders (DINOv2 and similar) a classifier head, so logit- and head-based
detectors apply: logits = z W^T + b on the raw stored features z (no normalisation is folded in).
Training: AdamW, mini-batches drawn in a seeded random order, a fixed number of epochs.
Defaults: epochs=20, lr=1e-3, weight_decay=0, batch_size=1024, seed=0.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..errors import InputError
from ..metrics import accuracy
from .backbones import save_head
from .featureset import FeatureSet

__all__ = ["train_probe", "probe_accuracy", "save_probe"]


def train_probe(
    train: FeatureSet,
    *,
    epochs: int = 20,
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    batch_size: int = 1024,
    seed: int = 0,
    num_classes: int | None = None,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """Fit ``(weight (C, D), bias (C,), per-epoch mean losses)`` on the labelled rows of ``train``."""
    from tqdm.auto import tqdm

    train.require(("features", "labels"), "a linear probe")
    if epochs < 1 or batch_size < 1 or lr <= 0:
        raise InputError(f"epochs, batch_size and lr must be positive, got {epochs}, {batch_size}, {lr}")
    idx = np.flatnonzero(np.asarray(train.labels) >= 0)
    y_all = np.asarray(train.labels)[idx]
    c = int(num_classes if num_classes is not None else y_all.max() + 1)
    if y_all.max() >= c:
        raise InputError(f"label {int(y_all.max())} does not fit num_classes={c}")
    d = train.features.shape[1]
    gen = torch.Generator().manual_seed(seed)
    layer = torch.nn.Linear(d, c)
    with torch.no_grad():  # seeded init, independent of the global RNG
        bound = 1.0 / np.sqrt(d)
        layer.weight.copy_(torch.empty(c, d).uniform_(-bound, bound, generator=gen))
        layer.bias.zero_()
    opt = torch.optim.AdamW(layer.parameters(), lr=lr, weight_decay=weight_decay)
    losses = []
    for _ in tqdm(range(epochs), desc="probe", unit="epoch", disable=not progress):
        order = torch.randperm(idx.size, generator=gen).numpy()
        total = 0.0
        for start in range(0, idx.size, batch_size):
            sel = np.sort(idx[order[start : start + batch_size]])
            x = torch.from_numpy(np.asarray(train.features[sel], dtype=np.float32))
            y = torch.from_numpy(np.asarray(train.labels[sel], dtype=np.int64))
            loss = torch.nn.functional.cross_entropy(layer(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(sel)
        losses.append(total / idx.size)
    return layer.weight.detach().numpy().copy(), layer.bias.detach().numpy().copy(), losses


def probe_accuracy(fs: FeatureSet, weight: np.ndarray, bias: np.ndarray, chunk: int = 65536) -> float:
    """Top-1 accuracy of the head on the labelled rows of ``fs``."""
    idx = np.flatnonzero(np.asarray(fs.labels) >= 0)
    if idx.size == 0:
        raise InputError("no labelled rows to measure accuracy on")
    pred = np.concatenate([(np.asarray(fs.features[idx[s : s + chunk]], dtype=np.float32) @ weight.T + bias).argmax(1)
                           for s in range(0, idx.size, chunk)])
    return accuracy(pred, np.asarray(fs.labels)[idx])


def save_probe(path: str | Path, weight: np.ndarray, bias: np.ndarray, info: dict) -> Path:
    """Write the head as safetensors (keys weight, bias) with ``info`` as string metadata."""
    return save_head(path, weight, bias, {k: str(v) for k, v in info.items()})

