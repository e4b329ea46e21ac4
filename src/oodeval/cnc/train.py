"""K+1 training with CnC outliers, checkpoints as safetensors + JSON, resumable, seeded.

CnC (Hebbalaguppe et al. 2022, arXiv:2207.13916, Sec. 3): a classifier with K+1 outputs is
trained on the ID set plus synthetic outliers labelled K (0-based, the (K+1)-th class). Each ID
batch (x, y) is paired with a CnC batch s built on the same images (:func:`oodeval.cnc.cutmix.compound`):

    loss = CE(f(x), y) + alpha * CE(f(s), K),   alpha = 1

(one forward pass over the concatenated batch). The ID prediction is the argmax over the first
K logits; the OOD score is p(K+1) (see the ``cnc`` detector). ``cnc=False`` trains the plain
K-way baseline with the same loop, data order and schedule.

Optimiser defaults follow the CnC code's CIFAR recipe scaled to the epoch budget: SGD, lr 0.1,
momentum 0.9, weight decay 5e-4, lr x 0.1 at 50% and 75% of the epochs (the code: 100 and 150 of
200). No input augmentation beyond CnC. Any timm model works (``pretrained=False``; pass
``pretrained_file`` in ``model_kwargs`` to start from local weights).

A checkpoint folder holds ``model.safetensors``, ``optimizer.safetensors`` + ``optimizer.json``,
``config.json`` and ``progress.json`` (epochs done, per-epoch history, scheduler state, data
hash). It is rewritten atomically after every epoch; calling :func:`train` again on the same
folder with the same config and data resumes after the last finished epoch and yields the same
weights as an uninterrupted run (data order and outliers depend only on seed, epoch and step).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from .._io import atomic_folder, check_output, hash_arrays
from .corruptions import CORRUPTIONS, DEFAULT_POOL

__all__ = [
    "TrainConfig", "to_tensor", "build_model", "id_predictions", "train", "save_checkpoint",
    "load_checkpoint", "extract", "CHECKPOINT_FORMAT",
]  # fmt: skip

CHECKPOINT_FORMAT = "oodeval.cnc.checkpoint/1"
CHECKPOINT_KIND = "CnC checkpoint"


@dataclass
class TrainConfig:
    """Everything that defines a run (stored as ``config.json``)."""

    model: str = "resnet18"
    num_classes: int = 10
    in_chans: int = 3
    cnc: bool = True
    alpha: float = 1.0
    epochs: int = 10
    batch_size: int = 128
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    milestones: tuple[float, ...] = (0.5, 0.75)
    gamma: float = 0.1
    seed: int = 0
    corruptions: tuple[str, ...] = DEFAULT_POOL
    placement: str = "center"
    mean: tuple[float, ...] = (0.5,)
    std: tuple[float, ...] = (0.5,)
    model_kwargs: dict = field(default_factory=dict)
    #: the source dataset's class ids kept as ID, in model order (None: labels used as they are)
    class_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.class_ids is not None:
            self.class_ids = tuple(int(c) for c in self.class_ids)
            if len(self.class_ids) != self.num_classes:
                raise ValueError(f"class_ids lists {len(self.class_ids)} classes but num_classes = {self.num_classes}")
        self.milestones = tuple(float(m) for m in self.milestones)
        self.corruptions = tuple(self.corruptions)
        self.mean = tuple(float(m) for m in self.mean)
        self.std = tuple(float(s) for s in self.std)
        problems = []
        if self.num_classes < 2:
            problems.append(f"num_classes must be >= 2, got {self.num_classes}")
        if self.epochs < 1:
            problems.append(f"epochs must be >= 1, got {self.epochs}")
        if self.batch_size < 2:
            problems.append(f"batch_size must be >= 2, got {self.batch_size}")
        if self.alpha < 0:
            problems.append(f"alpha must be >= 0, got {self.alpha}")
        bad = [c for c in self.corruptions if c not in CORRUPTIONS]
        if bad or not self.corruptions:
            problems.append(f"unknown or empty corruptions: {bad or 'empty'}")
        for name in ("mean", "std"):
            if len(getattr(self, name)) not in (1, self.in_chans):
                problems.append(f"{name} needs 1 or {self.in_chans} values, got {len(getattr(self, name))}")
        if problems:
            raise ValueError("invalid TrainConfig: " + "; ".join(problems))

    @property
    def outputs(self) -> int:
        """Number of logits: K+1 with CnC, K without."""
        return self.num_classes + 1 if self.cnc else self.num_classes

    def to_json(self) -> dict:
        d = asdict(self)
        for k in ("milestones", "corruptions", "mean", "std", "class_ids"):
            d[k] = None if d[k] is None else list(d[k])
        return d

    @classmethod
    def from_json(cls, d: dict) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"config.json has unknown fields: {', '.join(unknown)}")
        return cls(**d)


def to_tensor(images: np.ndarray, mean: Sequence[float] = (0.5,), std: Sequence[float] = (0.5,)):
    """uint8 (N, H, W[, C]) -> float32 torch (N, C, H, W), (x/255 - mean) / std per channel."""
    import torch

    a = np.asarray(images)
    if a.ndim == 3:
        a = a[..., None]
    if a.ndim != 4:
        raise ValueError(f"images must be (N, H, W) or (N, H, W, C), got shape {a.shape}")
    t = torch.from_numpy(np.ascontiguousarray(a)).permute(0, 3, 1, 2).float().div_(255.0)
    m = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    return (t - m) / s


def build_model(config: TrainConfig):
    """``timm.create_model(config.model, num_classes=K+1 (CnC) or K, in_chans, pretrained=False)``."""
    import timm

    kwargs = dict(config.model_kwargs)
    kwargs.setdefault("pretrained", False)
    return timm.create_model(config.model, num_classes=config.outputs, in_chans=config.in_chans, **kwargs)


def id_predictions(logits: np.ndarray, num_classes: int) -> np.ndarray:
    """The ID class prediction: argmax over the first ``num_classes`` (K) logits."""
    logits = np.asarray(logits)
    if logits.ndim != 2 or logits.shape[1] < num_classes:
        raise ValueError(f"logits must be (N, >= {num_classes}), got shape {logits.shape}")
    return logits[:, :num_classes].argmax(axis=1)


# ---------------------------------------------------------------- checkpoints


def _optimizer_to_files(state: dict) -> tuple[dict, dict]:
    import torch

    tensors, meta = {}, {"param_groups": state["param_groups"], "state": {}}
    for pid, st in state["state"].items():
        meta["state"][str(pid)] = {}
        for name, v in st.items():
            if isinstance(v, torch.Tensor):
                tensors[f"{pid}.{name}"] = v.detach().contiguous()
                meta["state"][str(pid)][name] = {"tensor": f"{pid}.{name}"}
            else:
                meta["state"][str(pid)][name] = {"value": v}
    return tensors, meta


def _optimizer_from_files(tensors: dict, meta: dict) -> dict:
    state = {}
    for pid, st in meta["state"].items():
        state[int(pid)] = {k: (tensors[v["tensor"]] if "tensor" in v else v["value"]) for k, v in st.items()}
    return {"state": state, "param_groups": meta["param_groups"]}


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("oodeval", "torch", "timm", "numpy", "scipy", "scikit-image", "pillow"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def save_checkpoint(folder: str | Path, model, optimizer, scheduler, config: TrainConfig, progress: dict) -> Path:
    """Write the checkpoint folder atomically, replacing an older checkpoint of oodeval's only."""
    from safetensors.torch import save_file

    folder = Path(folder)
    opt_tensors, opt_meta = _optimizer_to_files(optimizer.state_dict())
    with atomic_folder(folder, CHECKPOINT_KIND, is_checkpoint_folder) as tmp:
        tmp.mkdir()
        save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(tmp / "model.safetensors"))
        save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
        (tmp / "optimizer.json").write_text(json.dumps(opt_meta, indent=1, default=float) + "\n")
        (tmp / "config.json").write_text(json.dumps(config.to_json(), indent=2, sort_keys=True) + "\n")
        prog = dict(progress, format=CHECKPOINT_FORMAT, scheduler=scheduler.state_dict(), versions=_versions())
        (tmp / "progress.json").write_text(json.dumps(prog, indent=2, sort_keys=True, default=float) + "\n")
    return folder


def is_checkpoint_folder(folder: Path) -> bool:
    """Whether ``folder`` is a checkpoint folder oodeval wrote (its progress.json names the format)."""
    try:
        return json.loads((Path(folder) / "progress.json").read_text()).get("format") == CHECKPOINT_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _read_progress(folder: Path) -> dict:
    path = folder / "progress.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder} is not a CnC checkpoint folder (no progress.json)")
    prog = json.loads(path.read_text())
    if prog.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: format {prog.get('format')!r}, expected {CHECKPOINT_FORMAT!r}")
    return prog


def _read_config(folder: Path) -> TrainConfig:
    return TrainConfig.from_json(json.loads((folder / "config.json").read_text()))


def load_checkpoint(folder: str | Path):
    """(model in eval mode, TrainConfig, progress dict) from a checkpoint folder."""
    from safetensors.torch import load_file

    folder = Path(folder)
    progress = _read_progress(folder)
    config = _read_config(folder)
    model = build_model(config)
    model.load_state_dict(load_file(str(folder / "model.safetensors")))
    model.eval()
    return model, config, progress


# ---------------------------------------------------------------- training


def _make_optimizer(model, config: TrainConfig):
    import torch

    opt = torch.optim.SGD(
        model.parameters(), lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay
    )
    steps = sorted({max(1, int(round(f * config.epochs))) for f in config.milestones if 0 < f < 1})
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=steps, gamma=config.gamma)
    return opt, sched


def _check_data(images: np.ndarray, labels: np.ndarray, config: TrainConfig) -> tuple[np.ndarray, np.ndarray]:
    images = np.asarray(images)
    labels = np.asarray(labels, dtype=np.int64)
    if images.dtype != np.uint8 or images.ndim not in (3, 4):
        raise ValueError(f"images must be uint8 (N, H, W[, C]), got {images.dtype} {images.shape}")
    chans = 1 if images.ndim == 3 else images.shape[3]
    if chans != config.in_chans:
        raise ValueError(f"images have {chans} channel(s) but config.in_chans = {config.in_chans}")
    if labels.shape != (len(images),):
        raise ValueError(f"{len(images)} images but labels of shape {labels.shape}")
    bad = (labels < 0) | (labels >= config.num_classes)
    if bad.any():
        raise ValueError(f"{int(bad.sum())} labels outside 0..{config.num_classes - 1}")
    if len(images) < config.batch_size:
        raise ValueError(f"{len(images)} training images, fewer than one batch of {config.batch_size}")
    return images, labels


def _diff(old: TrainConfig, new: TrainConfig) -> list[str]:
    a, b = old.to_json(), new.to_json()
    return [f"{k} ({a[k]!r} in the checkpoint, {b[k]!r} now)" for k in a if a[k] != b[k]]


def train(
    config: TrainConfig,
    images: np.ndarray,
    labels: np.ndarray,
    out: str | Path,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    stop_after: int | None = None,
) -> dict:
    """Train (or resume) into checkpoint folder ``out``; returns the progress dict.

    ``images``: uint8 (N, H, W[, C]); ``labels``: 0..K-1. ``stop_after``: finish at most this many
    epochs in this call (the rest on a later call). Each epoch's history row: loss, loss_id,
    loss_outlier (CnC only), train_acc (argmax over the first K), lr, seconds.
    """
    import torch
    import torch.nn.functional as F
    from tqdm.auto import tqdm

    from .cutmix import compound, step_rng

    images, labels = _check_data(images, labels, config)
    out = check_output(out, CHECKPOINT_KIND, folder=True, is_own=is_checkpoint_folder)
    data_hash = hash_arrays({"images": images, "labels": labels})
    torch.manual_seed(config.seed)
    model = build_model(config)
    opt, sched = _make_optimizer(model, config)
    state = {"epochs_done": 0, "history": [], "data_hash": data_hash}
    if (out / "progress.json").is_file():
        from safetensors.torch import load_file

        prev = _read_progress(out)
        old = _read_config(out)
        changed = _diff(old, config)
        if changed:
            raise ValueError(f"{out} holds a run with other settings: {'; '.join(changed)}; use a new folder")
        if prev.get("data_hash") != data_hash:
            raise ValueError(f"{out} was trained on other data (hash {prev.get('data_hash')} != {data_hash})")
        model.load_state_dict(load_file(str(out / "model.safetensors")))
        opt_meta = json.loads((out / "optimizer.json").read_text())
        opt.load_state_dict(_optimizer_from_files(load_file(str(out / "optimizer.safetensors")), opt_meta))
        sched.load_state_dict(prev["scheduler"])
        state = {k: prev[k] for k in ("epochs_done", "history", "data_hash")}
        if log:
            log(f"resuming {out} after epoch {state['epochs_done']} of {config.epochs}")
    K = config.num_classes
    last = config.epochs if stop_after is None else min(config.epochs, state["epochs_done"] + stop_after)
    for epoch in range(state["epochs_done"], last):
        t0 = time.time()
        torch.manual_seed(int(np.random.default_rng([config.seed, epoch, 1]).integers(2**62)))
        model.train()
        order = np.random.default_rng([config.seed, epoch]).permutation(len(images))
        sums = {"loss": 0.0, "loss_id": 0.0, "loss_outlier": 0.0, "correct": 0, "seen": 0}
        starts = [s for s in range(0, len(order), config.batch_size) if len(order) - s >= 2]
        bar = tqdm(starts, desc=f"epoch {epoch + 1}/{config.epochs}", unit="batch", disable=not progress, leave=False)
        for t, start in enumerate(bar):
            idx = order[start : start + config.batch_size]
            x = to_tensor(images[idx], config.mean, config.std)
            y = torch.from_numpy(labels[idx])
            if config.cnc:
                syn, _ = compound(
                    images, labels, idx, step_rng(config.seed, epoch, t), config.corruptions, placement=config.placement
                )
                logits = model(torch.cat([x, to_tensor(syn, config.mean, config.std)]))
                logit_id, logit_syn = logits[: len(idx)], logits[len(idx) :]
                loss_id = F.cross_entropy(logit_id, y)
                loss_syn = F.cross_entropy(logit_syn, torch.full((len(syn),), K, dtype=torch.long))
                loss = loss_id + config.alpha * loss_syn
            else:
                logit_id = model(x)
                loss_id = F.cross_entropy(logit_id, y)
                loss_syn = torch.zeros(())
                loss = loss_id
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            n = len(idx)
            sums["loss"] += loss.item() * n
            sums["loss_id"] += loss_id.item() * n
            sums["loss_outlier"] += loss_syn.item() * n
            sums["correct"] += int((logit_id[:, :K].argmax(1) == y).sum())
            sums["seen"] += n
            bar.set_postfix(loss=f"{loss.item():.3f}")
        lr = opt.param_groups[0]["lr"]
        sched.step()
        row = {
            "epoch": epoch + 1,
            "loss": sums["loss"] / sums["seen"],
            "loss_id": sums["loss_id"] / sums["seen"],
            "train_acc": sums["correct"] / sums["seen"],
            "lr": lr,
            "seconds": round(time.time() - t0, 3),
        }
        if config.cnc:
            row["loss_outlier"] = sums["loss_outlier"] / sums["seen"]
        state["history"].append(row)
        state["epochs_done"] = epoch + 1
        save_checkpoint(out, model, opt, sched, config, state)
        if log:
            log(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    return _read_progress(out) if (out / "progress.json").is_file() else state


# ---------------------------------------------------------------- features


def extract(
    model,
    images: np.ndarray,
    config: TrainConfig,
    labels: np.ndarray | None = None,
    batch_size: int = 256,
    meta: dict | None = None,
):
    """One forward pass -> :class:`oodeval.features.FeatureSet` (pre-logit features, all logits,
    the linear head when the classifier is ``nn.Linear``). ``meta`` records ``cnc``,
    ``num_id_classes`` (K) and ``outlier_class`` (K for a CnC model, else None)."""
    import torch

    from ..features import FeatureSet

    images = np.asarray(images)
    feats, logits = [], []
    model.eval()
    with torch.no_grad():
        for start in range(0, len(images), batch_size):
            x = to_tensor(images[start : start + batch_size], config.mean, config.std)
            body = model.forward_features(x)
            feats.append(model.forward_head(body, pre_logits=True).flatten(1).numpy().astype(np.float32))
            logits.append(model.forward_head(body).numpy().astype(np.float32))
    head = model.get_classifier()
    weight = bias = None
    if isinstance(head, torch.nn.Linear) and head.bias is not None:
        weight = head.weight.detach().numpy().astype(np.float32)
        bias = head.bias.detach().numpy().astype(np.float32)
    info = {
        "model": config.model,
        "cnc": config.cnc,
        "num_id_classes": config.num_classes,
        "outlier_class": config.num_classes if config.cnc else None,
    }
    info.update(meta or {})
    return FeatureSet(
        features=np.concatenate(feats),
        labels=None if labels is None else np.asarray(labels, dtype=np.int64),
        logits=np.concatenate(logits),
        weight=weight,
        bias=bias,
        meta=info,
    )
