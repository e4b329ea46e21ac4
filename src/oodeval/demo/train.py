"""Train the demo's small convnet on ID-train (CPU, seeded) and cache it by content hash.

The model is a timm architecture created exactly as extraction creates it:
``timm.create_model(arch, num_classes=6, in_chans=1, pretrained_cfg_overlay=...)`` where the
overlay sets the input size (1, 28, 28), the ID-train pixel mean/std, crop_pct 1.0 and bilinear
interpolation, so timm's own data config reproduces the training preprocessing at extraction.

Training: SGD (momentum 0.9, Nesterov, weight decay 5e-4), one-cycle learning rate (peak
``lr``), cross-entropy, batch 128, augmentation = random horizontal flip and a random shift of up
to 2 px (black fill), in float64 (``dtype``): training amplifies rounding differences into other
weights, and float32's (other SIMD kernels sum in another order) moved the quick demo's FPR@95 by
up to 97 points on another CPU kernel; float64's are 1e9 times smaller, so the weights, rounded to
float32 when saved, are the same on every machine (docs/conventions.md#reproducibility). The weights go to ``<cache>/<hash>/model.safetensors`` where the hash
covers the ID-train content hash, the config, the trainer version and torch/timm versions; ``model.json`` beside
them records the config, the loss per epoch and the ID-test accuracy.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import timm
import torch
import torch.nn.functional as F

from .._io import atomic_folder, hash_json
from .data import read_set

#: bump when the training procedure changes, so cached weights are not reused across versions
TRAINER_VERSION = 3

__all__ = ["DemoTrainConfig", "TrainedModel", "timm_kwargs", "train_model", "evaluate_accuracy"]


@dataclass(frozen=True)
class DemoTrainConfig:
    """Hyperparameters of the demo classifier (defaults: under a minute on 2 quiet cores)."""

    arch: str = "test_resnet"
    arch_kwargs: dict = field(default_factory=dict)
    epochs: int = 6
    batch_size: int = 128
    lr: float = 0.1
    weight_decay: float = 5e-4
    augment: bool = True
    seed: int = 0
    dtype: str = "float64"


@dataclass(frozen=True)
class TrainedModel:
    """A trained (or cached) demo model: what extraction needs to rebuild it."""

    arch: str
    weights: Path
    model_kwargs: dict
    id_test_accuracy: float
    class_names: list[str]
    cached: bool
    info: dict


def timm_kwargs(config: DemoTrainConfig, num_classes: int, mean: float, std: float) -> dict:
    """``timm.create_model`` keyword arguments: head size, one input channel, and a pretrained
    config overlay with the 28x28 input and the ID-train pixel mean/std (pixels scaled to [0, 1])."""
    return dict(
        config.arch_kwargs,
        num_classes=num_classes,
        in_chans=1,
        pretrained_cfg_overlay=dict(
            input_size=(1, 28, 28),
            mean=(round(mean, 6),),
            std=(round(std, 6),),
            crop_pct=1.0,
            interpolation="bilinear",
        ),
    )


def _to_tensor(images: np.ndarray, mean: float, std: float):
    x = torch.from_numpy(np.ascontiguousarray(images)).float().div_(255.0)
    return x.sub_(mean).div_(std).unsqueeze(1)


def _augment(x, gen, fill: float):
    """Random horizontal flip and a random shift of up to 2 px, new pixels set to ``fill``
    (black after normalisation)."""
    n = x.shape[0]
    flip = torch.rand(n, generator=gen) < 0.5
    x = torch.where(flip[:, None, None, None], x.flip(-1), x)
    pad = 2
    padded = F.pad(x, (pad, pad, pad, pad), value=fill)
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=gen)
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=gen)
    rows = (dy[:, None] + torch.arange(28)[None, :])[:, None, :, None].expand(n, 1, 28, 28 + 2 * pad)
    out = padded.gather(2, rows)
    cols = (dx[:, None] + torch.arange(28)[None, :])[:, None, None, :].expand(n, 1, 28, 28)
    return out.gather(3, cols)


def _initialised(arch: str, kwargs: dict):
    """``timm.create_model(arch, **kwargs)`` with its initial draws made in float64 and rounded to
    float32: torch's float32 ``normal_`` draws other numbers under other CPU kernels
    (``ATEN_CPU_CAPABILITY``), its float64 draws differ by at most an ulp, which the rounding removes."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model = timm.create_model(arch, pretrained=False, **kwargs)
    finally:
        torch.set_default_dtype(previous)
    return model.float()


def evaluate_accuracy(model, images: np.ndarray, labels: np.ndarray, mean: float, std: float, batch_size: int = 512) -> float:
    """Top-1 accuracy of ``model`` (eval mode, no grad) on uint8 images with the given normalisation."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for s in range(0, len(images), batch_size):
            pred = model(_to_tensor(images[s : s + batch_size], mean, std)).argmax(1).numpy()
            correct += int((pred == labels[s : s + batch_size]).sum())
    return correct / len(images)


def train_model(
    train_set: str | Path,
    test_set: str | Path,
    cache_dir: str | Path,
    config: DemoTrainConfig | None = None,
    progress: bool = True,
) -> TrainedModel:
    """Train ``config.arch`` on the built ID-train set, or reuse the cached weights.

    ``train_set`` / ``test_set`` are folders built by :func:`oodeval.demo.data.build_benchmark`.
    Seeds ``torch.manual_seed(config.seed)`` and a dedicated generator for shuffling and
    augmentation, so the same data and config give the same weights on the same machine.
    """
    from safetensors.torch import save_file
    from tqdm.auto import tqdm


    config = config or DemoTrainConfig()
    train_set, test_set = Path(train_set), Path(test_set)
    train_build = json.loads((train_set / "build.json").read_text())
    test_build = json.loads((test_set / "build.json").read_text())
    names = list(train_build["class_names"])
    kwargs = timm_kwargs(config, len(names), train_build["pixel_mean"] / 255.0, train_build["pixel_std"] / 255.0)
    # train with exactly the (rounded) normalisation extraction will read from the overlay
    mean, std = kwargs["pretrained_cfg_overlay"]["mean"][0], kwargs["pretrained_cfg_overlay"]["std"][0]
    key = hash_json(
        {
            "trainer": TRAINER_VERSION,
            "train": train_build["content_hash"],
            "config": asdict(config),
            "model_kwargs": kwargs,
            "torch": torch.__version__,
            "timm": timm.__version__,
        }
    )
    folder = Path(cache_dir) / f"{config.arch}-{key[:16]}"
    info_file, weights = folder / "model.json", folder / "model.safetensors"
    if info_file.is_file() and weights.is_file():
        info = json.loads(info_file.read_text())
        return TrainedModel(config.arch, weights, kwargs, info["id_test_accuracy"], names, True, info)

    x_train, y_train, _ = read_set(train_set)
    x_test, y_test, _ = read_set(test_set)
    torch.manual_seed(config.seed)
    gen = torch.Generator().manual_seed(config.seed)
    dtype = {"float64": torch.float64, "float32": torch.float32}[config.dtype]
    model = _initialised(config.arch, kwargs).to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=0.9, nesterov=True, weight_decay=config.weight_decay)
    steps = config.epochs * -(-len(x_train) // config.batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=config.lr, total_steps=steps, pct_start=0.25)
    xt = _to_tensor(x_train, mean, std).to(dtype)
    yt = torch.from_numpy(y_train)
    losses = []
    start = time.perf_counter()
    bar = tqdm(total=steps, desc=f"train {config.arch}", unit="step", disable=not progress)
    for epoch in range(config.epochs):
        model.train()
        order = torch.randperm(len(xt), generator=gen)
        total, seen = 0.0, 0
        for s in range(0, len(order), config.batch_size):
            idx = order[s : s + config.batch_size]
            xb = _augment(xt[idx], gen, -mean / std) if config.augment else xt[idx]
            loss = torch.nn.functional.cross_entropy(model(xb), yt[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(idx)
            seen += len(idx)
            bar.update(1)
            bar.set_postfix(epoch=epoch + 1, loss=f"{total / seen:.3f}")
        losses.append(total / seen)
    bar.close()
    seconds = time.perf_counter() - start
    model.float()  # saved and extracted in float32, as every model is; accuracy of what is saved
    acc = evaluate_accuracy(model, x_test, y_test, mean, std)
    info = {
        "arch": config.arch,
        "config": asdict(config),
        "model_kwargs": kwargs,
        "class_names": names,
        "train_set": {"path": str(train_set), "content_hash": train_build["content_hash"], "n": len(x_train)},
        "test_set": {"path": str(test_set), "content_hash": test_build["content_hash"], "n": len(x_test)},
        "epoch_loss": losses,
        "train_seconds": seconds,
        "id_test_accuracy": acc,
        "chance_accuracy": 1.0 / len(names),
        "key": key,
    }
    with atomic_folder(folder, "demo model") as tmp:
        tmp.mkdir()
        state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        save_file(state, str(tmp / "model.safetensors"), metadata={"arch": config.arch, "key": key})
        (tmp / "model.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return TrainedModel(config.arch, weights, kwargs, acc, names, False, info)
