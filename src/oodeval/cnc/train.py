"""K+1 training with CnC outliers, checkpoints as safetensors + JSON, resumable, seeded.

CnC (Hebbalaguppe et al. 2022, arXiv:2207.13916, Sec. 3): a classifier with K+1 outputs is
trained on the ID set plus synthetic outliers labelled K (0-based, the (K+1)-th class). Each step
pairs an ID batch (x, y) with as many CnC outliers s (:func:`oodeval.cnc.cutmix.compound`):

    loss = CE(f(x), y) + alpha * CE(f(s), K),   alpha = 1

(one forward pass over the concatenated batch). The ID prediction is the argmax over the first
K logits; the OOD score is p(K+1) (see the ``cnc`` detector). ``cnc=False`` trains the plain
K-way baseline with the same loop, data order and schedule.

Defaults: SGD, lr 0.1, momentum 0.9, weight decay 5e-4, lr x 0.1 at 50% and 75% of the epochs.
``TrainConfig.recipe("cnc-cifar")`` is the CnC release's CIFAR recipe (``cnc-ood/cnc_ood``
``scripts/cifar10.sh``, ``utils/argparser.py``, ``datasets/cifar10.py``): ResNet-34 with a CIFAR
stem (timm ``resnet34`` with a 3x3 stride-1 first convolution and no max-pool, the release's
``models/resnet.py`` layout), 200 epochs, 64 ID + 64 outliers per step, lr 0.1 x 0.1 at epochs
100 and 150, weight decay 5e-4, random crop (padding 4) + flip for ID images, crop + flips +
rotation(15) for the outlier sources drawn by a separate shuffle, the release's 15-corruption
pool with the ImageNet-C severities it ran (``imagecorruptions``), CIFAR normalisation.

The learning rate of epoch e is a function of the config alone: lr * gamma^(milestones <= e),
milestones = round(f * epochs) for each fraction f (coinciding milestones decay once each), so a
resumed run follows the uninterrupted schedule. A run folder holds ``config.json`` (with the
image size, channels, K, data hash and frost source), ``progress.json`` (epochs done, history,
the current checkpoint) and ``epoch-NNNN/`` (``model.safetensors``, ``optimizer.safetensors`` +
``optimizer.json``). Each epoch writes a new ``epoch-NNNN/`` folder, then atomically replaces
``progress.json`` to point at it, then removes the previous one: a kill at any moment leaves the
last finished epoch loadable. Calling :func:`train` again resumes after it and gives the weights of
an uninterrupted run (on CPU; on CUDA up to the non-determinism of its kernels).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np

from .._io import atomic_path, claim_folder, hash_arrays, write_json_atomic
from .corruptions import CORRUPTIONS, DEFAULT_POOL, PRESETS, RELEASE_POOL, frost_source

__all__ = [
    "TrainConfig", "RECIPES", "to_tensor", "build_model", "id_predictions", "lr_at", "milestone_epochs",
    "resolve_device", "train", "save_checkpoint", "load_checkpoint", "extract", "CHECKPOINT_FORMAT",
]  # fmt: skip

CHECKPOINT_FORMAT = "oodeval.cnc.checkpoint/2"
_EPOCH_DIR = re.compile(r"^epoch-\d{4,}$")

#: named training recipes (see the module docstring); CLI ``--recipe``
RECIPES: dict[str, dict] = {
    "cnc-cifar": dict(
        model="resnet34", cifar_stem=True, epochs=200, batch_size=64, lr=0.1, momentum=0.9, weight_decay=5e-4,
        milestones=(0.5, 0.75), gamma=0.1, augment="crop_flip", outlier_augment="release",
        outlier_pairing="shuffled", severity="imagenet", corruptions=RELEASE_POOL,
        mean=(0.4914, 0.4822, 0.4465), std=(0.2023, 0.1994, 0.2010),
    ),
}  # fmt: skip
CHECKPOINT_KIND = "CnC checkpoint"


@dataclass
class TrainConfig:
    """Everything that defines a run (stored as ``config.json``).

    ``image_size`` (H, W), ``data_hash`` and ``frost`` are filled in by :func:`train` from the
    data and the installation; a value given here must match.
    """

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
    #: replace a timm ResNet's stride-2 stem + max-pool by a 3x3 stride-1 convolution (CIFAR stem)
    cifar_stem: bool = False
    #: ID augmentation: "none" or "crop_flip" (random crop with 4 px padding + horizontal flip)
    augment: str = "none"
    #: outlier-source augmentation before CutMix: "none" or "release" (crop, flips, rotation 15)
    outlier_augment: str = "none"
    #: outliers built on the ID batch ("same") or on a separately shuffled batch ("shuffled")
    outlier_pairing: str = "same"
    #: corruption severity constants: "auto" (by image size) or one of the references' presets
    severity: str = "auto"
    image_size: tuple[int, int] | None = None
    data_hash: str | None = None
    frost: str | None = None

    def __post_init__(self) -> None:
        if self.class_ids is not None:
            self.class_ids = tuple(int(c) for c in self.class_ids)
            if len(self.class_ids) != self.num_classes:
                raise ValueError(f"class_ids lists {len(self.class_ids)} classes but num_classes = {self.num_classes}")
        self.milestones = tuple(float(m) for m in self.milestones)
        self.corruptions = tuple(self.corruptions)
        self.mean = tuple(float(m) for m in self.mean)
        self.std = tuple(float(s) for s in self.std)
        if self.image_size is not None:
            self.image_size = tuple(int(v) for v in self.image_size)
        problems = []
        if self.num_classes < 2:
            problems.append(f"num_classes must be >= 2, got {self.num_classes}")
        if self.epochs < 1:
            problems.append(f"epochs must be >= 1, got {self.epochs}")
        if self.batch_size < 2:
            problems.append(f"batch_size must be >= 2, got {self.batch_size}")
        if self.alpha < 0:
            problems.append(f"alpha must be >= 0, got {self.alpha}")
        if any(not 0 < m < 1 for m in self.milestones):
            problems.append(f"milestones are fractions of the epochs in (0, 1), got {list(self.milestones)}")
        bad = [c for c in self.corruptions if c not in CORRUPTIONS]
        if bad or not self.corruptions:
            problems.append(f"unknown or empty corruptions: {bad or 'empty'}")
        for name in ("mean", "std"):
            if len(getattr(self, name)) not in (1, self.in_chans):
                problems.append(f"{name} needs 1 or {self.in_chans} values, got {len(getattr(self, name))}")
        for name, allowed in (
            ("augment", ("none", "crop_flip")), ("outlier_augment", ("none", "release")),
            ("outlier_pairing", ("same", "shuffled")), ("severity", ("auto",) + PRESETS),
        ):  # fmt: skip
            if getattr(self, name) not in allowed:
                problems.append(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if problems:
            raise ValueError("invalid TrainConfig: " + "; ".join(problems))

    @classmethod
    def recipe(cls, name: str, **overrides) -> TrainConfig:
        """The named recipe of :data:`RECIPES` with ``overrides`` (e.g. num_classes, in_chans, seed)."""
        if name not in RECIPES:
            raise ValueError(f"unknown recipe {name!r}; known: {', '.join(RECIPES)}")
        return cls(**{**RECIPES[name], **overrides})

    @property
    def outputs(self) -> int:
        """Number of logits: K+1 with CnC, K without."""
        return self.num_classes + 1 if self.cnc else self.num_classes

    def to_json(self) -> dict:
        d = asdict(self)
        for k in ("milestones", "corruptions", "mean", "std", "class_ids", "image_size"):
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


def _cifar_stem(model, name: str) -> None:
    """3x3 stride-1 first convolution, no max-pool (He et al. 2016's CIFAR ResNets)."""
    import torch.nn as nn

    conv = getattr(model, "conv1", None)
    if not hasattr(model, "maxpool") or conv is None:
        raise ValueError(f"cifar_stem needs a timm ResNet (conv1 + maxpool); {name} has none")
    first = conv if isinstance(conv, nn.Conv2d) else next(m for m in conv.modules() if isinstance(m, nn.Conv2d))
    new = nn.Conv2d(first.in_channels, first.out_channels, 3, stride=1, padding=1, bias=False)
    if first is conv:
        model.conv1 = new
    else:
        conv[0] = new
    model.maxpool = nn.Identity()


def build_model(config: TrainConfig):
    """``timm.create_model(config.model, num_classes=K+1 (CnC) or K, in_chans, pretrained=False)``,
    with a CIFAR stem when ``config.cifar_stem``."""
    import timm

    kwargs = dict(config.model_kwargs)
    kwargs.setdefault("pretrained", False)
    model = timm.create_model(config.model, num_classes=config.outputs, in_chans=config.in_chans, **kwargs)
    if config.cifar_stem:
        _cifar_stem(model, config.model)
    return model


def id_predictions(logits: np.ndarray, num_classes: int) -> np.ndarray:
    """The ID class prediction: argmax over the first ``num_classes`` (K) logits."""
    logits = np.asarray(logits)
    if logits.ndim != 2 or logits.shape[1] < num_classes:
        raise ValueError(f"logits must be (N, >= {num_classes}), got shape {logits.shape}")
    return logits[:, :num_classes].argmax(axis=1)


def milestone_epochs(config: TrainConfig) -> list[int]:
    """Epoch indices (0-based) from which each decay applies: max(1, round(f * epochs)) per fraction,
    duplicates kept (two milestones on one epoch decay twice)."""
    return sorted(max(1, int(round(f * config.epochs))) for f in config.milestones)


def lr_at(config: TrainConfig, epoch: int) -> float:
    """The learning rate of (0-based) ``epoch``: lr * gamma ** (number of milestones <= epoch)."""
    return config.lr * config.gamma ** sum(m <= epoch for m in milestone_epochs(config))


def resolve_device(device: str = "auto"):
    """``"auto"`` (CUDA when available, else CPU), ``"cpu"`` or ``"cuda"`` / ``"cuda:N"``."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if not (device == "cpu" or device.startswith("cuda")):
        raise ValueError(f"device must be auto, cpu or cuda[:N], got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device cuda was asked for but torch sees no CUDA device")
    return torch.device(device)


def _forward(model, x, amp: bool):
    """Logits with the trunk under bf16 autocast (when ``amp``) and the head in float32."""
    import torch

    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=amp):
        body = model.forward_features(x)
    return model.forward_head(body.float())


# ---------------------------------------------------------------- checkpoints


def _optimizer_to_files(state: dict) -> tuple[dict, dict]:
    import torch

    tensors, meta = {}, {"param_groups": state["param_groups"], "state": {}}
    for pid, st in state["state"].items():
        meta["state"][str(pid)] = {}
        for name, v in st.items():
            if isinstance(v, torch.Tensor):
                tensors[f"{pid}.{name}"] = v.detach().cpu().contiguous()
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
    for pkg in ("oodeval", "torch", "timm", "numpy", "scipy", "scikit-image", "pillow", "imagecorruptions"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def save_checkpoint(folder: str | Path, model, optimizer, config: TrainConfig, progress: dict) -> Path:
    """Write ``epoch-NNNN/`` (weights, optimizer), then point ``progress.json`` at it, then drop the
    previous epoch folder; ``config.json`` is written once. ``folder`` must be new or oodeval's own
    run folder (anything else is refused). Returns the epoch folder."""
    from safetensors.torch import save_file

    folder = claim_folder(folder, CHECKPOINT_KIND, is_own=is_checkpoint_folder)
    if not (folder / "config.json").is_file():
        write_json_atomic(folder / "config.json", config.to_json())
    name = f"epoch-{progress['epochs_done']:04d}"
    target = folder / name
    if target.exists():  # left by a run killed before it updated progress.json
        shutil.rmtree(target)
    opt_tensors, opt_meta = _optimizer_to_files(optimizer.state_dict())
    with atomic_path(target) as tmp:
        tmp.mkdir()
        save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, str(tmp / "model.safetensors"))
        save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
        (tmp / "optimizer.json").write_text(json.dumps(opt_meta, indent=1, default=float) + "\n")
    write_json_atomic(folder / "progress.json", dict(progress, format=CHECKPOINT_FORMAT, checkpoint=name, versions=_versions()))
    for old in folder.iterdir():
        if old.name != name and _EPOCH_DIR.match(old.name) and old.is_dir():
            shutil.rmtree(old)
    return target


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
        raise ValueError(f"{path}: format {prog.get('format')!r}, expected {CHECKPOINT_FORMAT!r} (retrain with this version)")
    return prog


def _read_config(folder: Path) -> TrainConfig:
    return TrainConfig.from_json(json.loads((folder / "config.json").read_text()))


def load_checkpoint(folder: str | Path):
    """(model in eval mode, TrainConfig, progress dict) from a run folder."""
    from safetensors.torch import load_file

    folder = Path(folder)
    progress = _read_progress(folder)
    config = _read_config(folder)
    model = build_model(config)
    model.load_state_dict(load_file(str(folder / progress["checkpoint"] / "model.safetensors")))
    model.eval()
    return model, config, progress


# ---------------------------------------------------------------- training


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


def _complete(config: TrainConfig, images: np.ndarray, labels: np.ndarray) -> TrainConfig:
    """``config`` with image_size, data_hash and frost filled in (a given value must agree)."""
    found = {
        "image_size": tuple(images.shape[1:3]),
        "data_hash": hash_arrays({"images": images, "labels": labels}),
        "frost": frost_source() if config.cnc and "frost" in config.corruptions else None,
    }
    for k, v in found.items():
        if getattr(config, k) is not None and getattr(config, k) != v:
            raise ValueError(f"config.{k} = {getattr(config, k)!r} but the training data give {v!r}")
    return replace(config, **found)


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
    device: str = "auto",
    workers: int = 0,
) -> dict:
    """Train (or resume) into run folder ``out``; returns the progress dict.

    ``images``: uint8 (N, H, W[, C]); ``labels``: 0..K-1. ``stop_after``: finish at most this many
    epochs in this call (the rest on a later call). ``device``: auto / cpu / cuda (on CUDA the
    trunk runs under bf16 autocast, the head in float32, channels_last). ``workers``: DataLoader
    processes building the steps (:mod:`oodeval.cnc.loader`; 0 = in this process; the batches do
    not depend on it). Each epoch's history row: loss, loss_id, loss_outlier (CnC only), train_acc
    (argmax over the first K), lr, seconds, device.
    """
    import torch
    import torch.nn.functional as F
    from tqdm.auto import tqdm

    from .loader import step_loader

    images, labels = _check_data(images, labels, config)
    config = _complete(config, images, labels)
    dev = resolve_device(device)
    amp = dev.type == "cuda"
    out = claim_folder(out, CHECKPOINT_KIND, is_own=is_checkpoint_folder)
    torch.manual_seed(config.seed)
    model = build_model(config)
    state = {"epochs_done": 0, "history": []}
    resumed = (out / "progress.json").is_file()
    if resumed:
        prev = _read_progress(out)
        old = _read_config(out)
        if old.data_hash != config.data_hash:
            raise ValueError(f"{out} was trained on other data (hash {old.data_hash} != {config.data_hash}); use a new folder")
        changed = _diff(old, config)
        if changed:
            raise ValueError(f"{out} holds a run with other settings: {'; '.join(changed)}; use a new folder")
        from safetensors.torch import load_file

        model.load_state_dict(load_file(str(out / prev["checkpoint"] / "model.safetensors")))
        state = {k: prev[k] for k in ("epochs_done", "history")}
    model.to(dev)
    if amp:
        model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    if resumed:
        from safetensors.torch import load_file

        ck = out / prev["checkpoint"]
        opt_state = _optimizer_from_files(load_file(str(ck / "optimizer.safetensors"), device=str(dev)),
                                          json.loads((ck / "optimizer.json").read_text()))  # fmt: skip
        opt.load_state_dict(opt_state)
        if log:
            log(f"resuming {out} after epoch {state['epochs_done']} of {config.epochs}")
    K = config.num_classes
    outlier_target = torch.tensor(K, device=dev)
    last = config.epochs if stop_after is None else min(config.epochs, state["epochs_done"] + stop_after)
    for epoch in range(state["epochs_done"], last):
        t0 = time.time()
        torch.manual_seed(int(np.random.default_rng([config.seed, epoch, 1]).integers(2**62)))
        lr = lr_at(config, epoch)
        for group in opt.param_groups:
            group["lr"] = lr
        model.train()
        sums = {"loss": 0.0, "loss_id": 0.0, "loss_outlier": 0.0, "correct": 0, "seen": 0}
        loader = step_loader(images, labels, config, epoch, workers=workers, pin_memory=amp)
        bar = tqdm(loader, desc=f"epoch {epoch + 1}/{config.epochs}", unit="batch", disable=not progress, leave=False)
        for batch in bar:
            x = batch["x"].to(dev, non_blocking=True)
            y = batch["y"].to(dev, non_blocking=True)
            n = len(y)
            if config.cnc:
                x = torch.cat([x, batch["outliers"].to(dev, non_blocking=True)])
            if amp:
                x = x.contiguous(memory_format=torch.channels_last)
            logits = _forward(model, x, amp)
            logit_id = logits[:n]
            loss_id = F.cross_entropy(logit_id, y)
            if config.cnc:
                logit_syn = logits[n:]
                loss_syn = F.cross_entropy(logit_syn, outlier_target.expand(len(logit_syn)))
                loss = loss_id + config.alpha * loss_syn
            else:
                loss_syn = torch.zeros((), device=dev)
                loss = loss_id
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sums["loss"] += loss.item() * n
            sums["loss_id"] += loss_id.item() * n
            sums["loss_outlier"] += loss_syn.item() * n
            sums["correct"] += int((logit_id[:, :K].argmax(1) == y).sum())
            sums["seen"] += n
            bar.set_postfix(loss=f"{loss.item():.3f}")
        row = {
            "epoch": epoch + 1,
            "loss": sums["loss"] / sums["seen"],
            "loss_id": sums["loss_id"] / sums["seen"],
            "train_acc": sums["correct"] / sums["seen"],
            "lr": lr,
            "seconds": round(time.time() - t0, 3),
            "device": str(dev) + (" bf16-trunk" if amp else ""),
        }
        if config.cnc:
            row["loss_outlier"] = sums["loss_outlier"] / sums["seen"]
        state["history"].append(row)
        state["epochs_done"] = epoch + 1
        save_checkpoint(out, model, opt, config, state)
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
    device: str = "cpu",
):
    """One forward pass -> :class:`oodeval.features.FeatureSet` (pre-logit features, all logits,
    the linear head when the classifier is ``nn.Linear``). ``meta`` records ``cnc``,
    ``num_id_classes`` (K) and ``outlier_class`` (K for a CnC model, else None). On CUDA the trunk
    runs under bf16 autocast (channels_last), the head in float32."""
    import torch

    from ..features import FeatureSet

    images = np.asarray(images)
    dev = resolve_device(device)
    amp = dev.type == "cuda"
    model.to(dev)
    if amp:
        model.to(memory_format=torch.channels_last)
    feats, logits = [], []
    model.eval()
    with torch.no_grad():
        for start in range(0, len(images), batch_size):
            x = to_tensor(images[start : start + batch_size], config.mean, config.std).to(dev)
            if amp:
                x = x.contiguous(memory_format=torch.channels_last)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
                body = model.forward_features(x)
            body = body.float()
            feats.append(model.forward_head(body, pre_logits=True).flatten(1).cpu().numpy().astype(np.float32))
            logits.append(model.forward_head(body).cpu().numpy().astype(np.float32))
    head = model.get_classifier()
    weight = bias = None
    if isinstance(head, torch.nn.Linear) and head.bias is not None:
        weight = head.weight.detach().cpu().numpy().astype(np.float32)
        bias = head.bias.detach().cpu().numpy().astype(np.float32)
    info = {
        "model": config.model,
        "cnc": config.cnc,
        "num_id_classes": config.num_classes,
        "outlier_class": config.num_classes if config.cnc else None,
        "frost": config.frost,
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
