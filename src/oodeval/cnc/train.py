"""K+1 training with CnC outliers, checkpoints as safetensors + JSON, resumable, seeded.

CnC (Hebbalaguppe et al. 2022, arXiv:2207.13916, Sec. 3): a classifier with K+1 outputs is
trained on the ID set plus synthetic outliers labelled K (0-based, the (K+1)-th class). Each step
pairs an ID batch (x, y) with as many CnC outliers s (:func:`oodeval.cnc.cutmix.compound`):

    loss = CE(f(x), y) + alpha * CE(f(s), K),   alpha = 1

(one forward pass over the concatenated batch). The ID prediction is the argmax over the first
K logits; the OOD score is p(K+1) (see the ``cnc`` detector). ``cnc=False`` trains the plain
K-way baseline with the same loop, data order and schedule.

Defaults: SGD, lr 0.1, momentum 0.9, weight decay 5e-4, lr x 0.1 at 50% and 75% of the epochs.
``CnCTrainConfig.recipe("cnc-cifar")`` is the CnC release's CIFAR recipe (``cnc-ood/cnc_ood``
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
last finished epoch loadable. ``config.json`` is written just before the first ``progress.json``
and checked on every start, also when a kill left it without a ``progress.json``; staging folders
and unreferenced ``epoch-NNNN/`` folders a kill left are removed on the next start. Calling
:func:`train` again resumes after the last finished epoch and gives the weights of an
uninterrupted run (on CPU; on CUDA up to the non-determinism of its kernels). The device type and
the autocast precision are part of the config (:func:`resolve_precision`).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import timm
import torch
import torch.nn as nn
import torch.nn.functional as F

from .._device import resolve_device
from .._io import atomic_path, claim_folder, hash_arrays, write_json_atomic
from ..errors import InputError
from ..features import FeatureSet
from .corruptions import CORRUPTIONS, DEFAULT_POOL, PRESETS, RELEASE_POOL, frost_source
from .loader import step_loader
from .tensors import to_tensor

__all__ = [
    "CnCTrainConfig", "RECIPES", "to_tensor", "build_model", "id_predictions", "lr_at", "milestone_epochs",
    "resolve_precision", "PRECISIONS", "train", "save_checkpoint", "load_checkpoint", "load_tensors",
    "is_finished", "extract_in_memory", "CHECKPOINT_FORMAT",
]  # fmt: skip

CHECKPOINT_FORMAT = "oodeval.cnc.checkpoint/2"
_EPOCH_DIR = re.compile(r"^epoch-\d{4,}$")

#: named training recipes (see the module docstring); CLI ``--recipe``
RECIPES: dict[str, dict] = {
    "cnc-cifar": dict(
        model="resnet34", cifar_stem=True, epochs=200, batch_size=64, lr=0.1, momentum=0.9, weight_decay=5e-4,
        milestones=(0.5, 0.75), gamma=0.1, augment="crop_flip", outlier_augment="release",
        outlier_pairing="shuffled", severity="imagecorruptions", corruptions=RELEASE_POOL,
        mean=(0.4914, 0.4822, 0.4465), std=(0.2023, 0.1994, 0.2010),
    ),
}  # fmt: skip
CHECKPOINT_KIND = "CnC checkpoint"


@dataclass
class CnCTrainConfig:
    """Everything that defines a run (stored as ``config.json``).

    ``image_size`` (H, W), ``data_hash``, ``frost``, ``device`` and ``precision`` are filled in by
    :func:`train` from the data, the installation and the device; a value given here must match.
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
    #: where the run trains: "cpu" or "cuda" (filled in by :func:`train`)
    device: str | None = None
    #: autocast dtype of the trunk: "fp32" (none), "bf16" or "fp16" (with a GradScaler); see :func:`resolve_precision`
    precision: str | None = None

    def __post_init__(self) -> None:
        if self.class_ids is not None:
            self.class_ids = tuple(int(c) for c in self.class_ids)
            if len(self.class_ids) != self.num_classes:
                raise InputError(f"class_ids lists {len(self.class_ids)} classes but num_classes = {self.num_classes}")
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
            ("device", (None, "cpu", "cuda")), ("precision", (None,) + PRECISIONS),
        ):  # fmt: skip
            if getattr(self, name) not in allowed:
                problems.append(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if problems:
            raise InputError("invalid CnCTrainConfig: " + "; ".join(problems))

    @classmethod
    def recipe(cls, name: str, **overrides) -> CnCTrainConfig:
        """The named recipe of :data:`RECIPES` with ``overrides`` (e.g. num_classes, in_chans, seed)."""
        if name not in RECIPES:
            raise InputError(f"unknown recipe {name!r}; known: {', '.join(RECIPES)}")
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
    def from_json(cls, d: dict) -> CnCTrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise InputError(f"config.json has unknown fields: {', '.join(unknown)}")
        return cls(**d)


def _cifar_stem(model, name: str) -> None:
    """3x3 stride-1 first convolution, no max-pool (He et al. 2016's CIFAR ResNets)."""
    conv = getattr(model, "conv1", None)
    if not hasattr(model, "maxpool") or conv is None:
        raise InputError(f"cifar_stem needs a timm ResNet (conv1 + maxpool); {name} has none")
    first = conv if isinstance(conv, nn.Conv2d) else next(m for m in conv.modules() if isinstance(m, nn.Conv2d))
    new = nn.Conv2d(first.in_channels, first.out_channels, 3, stride=1, padding=1, bias=False)
    if first is conv:
        model.conv1 = new
    else:
        conv[0] = new
    model.maxpool = nn.Identity()


def build_model(config: CnCTrainConfig):
    """``timm.create_model(config.model, num_classes=K+1 (CnC) or K, in_chans, pretrained=False)``,
    with a CIFAR stem when ``config.cifar_stem``."""
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
        raise InputError(f"logits must be (N, >= {num_classes}), got shape {logits.shape}")
    return logits[:, :num_classes].argmax(axis=1)


def milestone_epochs(config: CnCTrainConfig) -> list[int]:
    """Epoch indices (0-based) from which each decay applies: max(1, round(f * epochs)) per fraction,
    duplicates kept (two milestones on one epoch decay twice)."""
    return sorted(max(1, int(round(f * config.epochs))) for f in config.milestones)


def lr_at(config: CnCTrainConfig, epoch: int) -> float:
    """The learning rate of (0-based) ``epoch``: lr * gamma ** (number of milestones <= epoch)."""
    return config.lr * config.gamma ** sum(m <= epoch for m in milestone_epochs(config))


#: autocast dtypes of the trunk (the head and the loss always run in float32)
PRECISIONS = ("fp32", "bf16", "fp16")


def _native_bf16(dev) -> bool:
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # older torch: no emulation flag
        return torch.cuda.get_device_capability(dev)[0] >= 8


def resolve_precision(dev, precision: str = "auto") -> str:
    """The trunk's autocast dtype on ``dev``: ``"auto"`` is bf16 on a CUDA device with native bf16
    (compute capability 8.0 or newer), else fp16 (with a GradScaler in training) on CUDA, and fp32
    on CPU. An explicit choice is checked: fp16 needs CUDA; bf16 on CUDA needs native support (an
    emulating GPU such as a V100 or T4 runs it many times slower); bf16 on CPU is allowed."""
    if precision not in ("auto",) + PRECISIONS:
        raise InputError(f"precision must be auto, {', '.join(PRECISIONS)}; got {precision!r}")
    cuda = dev.type == "cuda"
    if precision == "auto":
        return ("bf16" if _native_bf16(dev) else "fp16") if cuda else "fp32"
    if precision == "fp16" and not cuda:
        raise InputError("precision fp16 needs a CUDA device; use fp32 or bf16 on CPU")
    if precision == "bf16" and cuda and not _native_bf16(dev):
        raise InputError(f"{dev} emulates bf16 (no native support); use --precision fp16 or fp32")
    return precision


def _autocast(dev, precision: str):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    return torch.autocast(dev.type, dtype=dtype or torch.float32, enabled=dtype is not None)


def _forward(model, x, precision: str):
    """Logits with the trunk under autocast in ``precision`` and the head in float32."""
    with _autocast(x.device, precision):
        body = model.forward_features(x)
    return model.forward_head(body.float())


def load_tensors(path: Path, device: str = "cpu") -> dict:
    """The tensors of a safetensors file; a missing, truncated or corrupt file is a ValueError naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device=device)
    except (SafetensorError, OSError, ValueError) as exc:
        raise InputError(f"{path}: unreadable checkpoint file ({type(exc).__name__}: {exc}); "
                         "retrain, or resume from a copy of the run folder") from None


def _read_json(path: Path, what: str) -> dict:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: unreadable {what} ({type(exc).__name__}: {exc})") from None
    if not isinstance(d, dict):
        raise InputError(f"{path}: {what} must hold a JSON object")
    return d


# ---------------------------------------------------------------- checkpoints


def _optimizer_to_files(state: dict) -> tuple[dict, dict]:
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


def save_checkpoint(folder: str | Path, model, optimizer, config: CnCTrainConfig, progress: dict, scaler=None) -> Path:
    """Write ``epoch-NNNN/`` (weights, optimizer, the fp16 GradScaler's state), then point
    ``progress.json`` at it, then drop the previous epoch folder. ``config.json`` is (re)written
    before the first ``progress.json`` and never after: a folder with a ``progress.json`` always
    has the config that run trained with. ``folder`` must be new or oodeval's own run folder
    (anything else is refused). Returns the epoch folder."""
    from safetensors.torch import save_file

    folder = claim_folder(folder, CHECKPOINT_KIND)
    if not (folder / "progress.json").is_file():
        write_json_atomic(folder / "config.json", config.to_json())
    name = f"epoch-{progress['epochs_done']:04d}"
    target = folder / name
    if target.exists():  # left by a run killed before it updated progress.json
        shutil.rmtree(target)
    opt_tensors, opt_meta = _optimizer_to_files(optimizer.state_dict())
    if scaler is not None and scaler.is_enabled():
        opt_meta["scaler"] = scaler.state_dict()
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


def _read_progress(folder: Path) -> dict:
    path = folder / "progress.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder} is not a CnC checkpoint folder (no progress.json)")
    prog = _read_json(path, "progress record")
    if prog.get("format") != CHECKPOINT_FORMAT:
        raise InputError(f"{path}: format {prog.get('format')!r}, expected {CHECKPOINT_FORMAT!r} (retrain with this version)")
    return prog


def _read_config(folder: Path) -> CnCTrainConfig:
    path = folder / "config.json"
    try:
        return CnCTrainConfig.from_json(_read_json(path, "training config"))
    except TypeError as exc:
        raise InputError(f"{path}: not a training config ({exc})") from None
    except ValueError as exc:
        raise InputError(str(exc) if str(exc).startswith(str(path)) else f"{path}: {exc}") from None


def _recorded_device(config: CnCTrainConfig, progress: dict) -> CnCTrainConfig:
    """A config written before device and precision were recorded (both None) gets them from its
    history rows ("cpu" -> fp32, "cuda... bf16-trunk" -> bf16, that version's only choices)."""
    history = progress.get("history") or []
    if config.device is not None or config.precision is not None or not history:
        return config
    seen = {str(h.get("device", "")) for h in history}
    if len(seen) != 1:
        return config
    dev = seen.pop()
    if dev == "cpu":
        return replace(config, device="cpu", precision="fp32")
    if dev.startswith("cuda") and dev.endswith("bf16-trunk"):
        return replace(config, device="cuda", precision="bf16")
    return config


def _load_weights(model, path: Path) -> None:
    try:
        model.load_state_dict(load_tensors(path))
    except RuntimeError as exc:
        raise InputError(f"{path}: weights that do not fit the config's model ({str(exc).splitlines()[0]})") from None


def is_finished(config: CnCTrainConfig, progress: dict) -> bool:
    """Whether the run reached its configured number of epochs."""
    return int(progress.get("epochs_done", 0)) >= config.epochs


def load_checkpoint(folder: str | Path):
    """(model in eval mode, CnCTrainConfig, progress dict) from a run folder; unreadable files are a
    ValueError naming them."""
    folder = Path(folder)
    progress = _read_progress(folder)
    config = _recorded_device(_read_config(folder), progress)
    model = build_model(config)
    _load_weights(model, folder / str(progress.get("checkpoint")) / "model.safetensors")
    model.eval()
    return model, config, progress


# ---------------------------------------------------------------- training


def _check_data(images: np.ndarray, labels: np.ndarray, config: CnCTrainConfig) -> tuple[np.ndarray, np.ndarray]:
    images = np.asarray(images)
    labels = np.asarray(labels, dtype=np.int64)
    if images.dtype != np.uint8 or images.ndim not in (3, 4):
        raise InputError(f"images must be uint8 (N, H, W[, C]), got {images.dtype} {images.shape}")
    chans = 1 if images.ndim == 3 else images.shape[3]
    if chans != config.in_chans:
        raise InputError(f"images have {chans} channel(s) but config.in_chans = {config.in_chans}")
    if labels.shape != (len(images),):
        raise InputError(f"{len(images)} images but labels of shape {labels.shape}")
    bad = (labels < 0) | (labels >= config.num_classes)
    if bad.any():
        raise InputError(f"{int(bad.sum())} labels outside 0..{config.num_classes - 1}")
    if len(images) < config.batch_size:
        raise InputError(f"{len(images)} training images, fewer than one batch of {config.batch_size}")
    return images, labels


def _complete(config: CnCTrainConfig, images: np.ndarray, labels: np.ndarray, dev, precision: str) -> CnCTrainConfig:
    """``config`` with image_size, data_hash, frost, device and precision filled in (a given value must agree)."""
    found = {
        "image_size": tuple(images.shape[1:3]),
        "data_hash": hash_arrays({"images": images, "labels": labels}),
        "frost": frost_source() if config.cnc and "frost" in config.corruptions else None,
        "device": dev.type,
        "precision": precision,
    }
    for k, v in found.items():
        if getattr(config, k) is not None and getattr(config, k) != v:
            raise InputError(f"config.{k} = {getattr(config, k)!r} but the training data and device give {v!r}")
    return replace(config, **found)


def _diff(old: CnCTrainConfig, new: CnCTrainConfig) -> list[str]:
    a, b = old.to_json(), new.to_json()
    return [f"{k} ({a[k]!r} in the checkpoint, {b[k]!r} now)" for k in a if a[k] != b[k]]


#: staging folders :func:`oodeval._io.atomic_path` leaves beside a run folder's files when killed
_STAGING = re.compile(r"^\.(epoch-\d{4,}|progress\.json|config\.json)\..+\.tmp$")


def _remove_leftovers(folder: Path, progress: dict | None) -> list[str]:
    """Remove what a killed run left in its own run folder: staging folders of its checkpoint,
    ``progress.json`` and ``config.json`` writes, and ``epoch-NNNN/`` folders that
    ``progress.json`` does not point at. Returns the names removed."""
    current = None if progress is None else progress.get("checkpoint")
    gone = []
    for p in sorted(folder.iterdir()):
        if p.is_dir() and not p.is_symlink() and (_STAGING.match(p.name) or (_EPOCH_DIR.match(p.name) and p.name != current)):
            shutil.rmtree(p)
            gone.append(p.name)
    return gone


def _check_folder(out: Path, config: CnCTrainConfig) -> dict | None:
    """The progress record of the run in ``out`` (None for a new run), after checking that its
    ``config.json``, when there is one, matches ``config``: a folder left by a run killed before
    its first ``progress.json`` is checked as well as one that holds finished epochs."""
    prev = _read_progress(out) if (out / "progress.json").is_file() else None
    if prev is None and not (out / "config.json").is_file():
        return None
    old = _read_config(out) if prev is None else _recorded_device(_read_config(out), prev)
    if old.data_hash != config.data_hash:
        raise InputError(f"{out} was trained on other data (hash {old.data_hash} != {config.data_hash}); use a new folder")
    changed = _diff(old, config)
    if changed:
        state = "holds a run" if prev else "holds the config of a run killed before its first epoch ended"
        raise InputError(f"{out} {state} with other settings: {'; '.join(changed)}; use a new folder")
    return prev


def _scaler(precision: str):
    return torch.amp.GradScaler("cuda", enabled=precision == "fp16")


def train(
    config: CnCTrainConfig,
    images: np.ndarray,
    labels: np.ndarray,
    out: str | Path,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    stop_after: int | None = None,
    device: str = "auto",
    workers: int = 0,
    precision: str = "auto",
) -> dict:
    """Train (or resume) into run folder ``out``; returns the progress dict.

    ``images``: uint8 (N, H, W[, C]); ``labels``: 0..K-1. ``stop_after``: finish at most this many
    epochs in this call (the rest on a later call). ``device``: auto / cpu / cuda; ``precision``:
    the trunk's autocast dtype (:func:`resolve_precision`: auto = bf16 on GPUs with native bf16,
    else fp16 with a GradScaler, fp32 on CPU); both are recorded in the config, so a resume or a
    mean over runs with another device or precision is refused. On CUDA the model runs
    channels_last; the head and the loss run in float32. ``workers``: DataLoader processes
    building the steps (:mod:`oodeval.cnc.loader`; 0 = in this process; the batches do not
    depend on it). Each epoch's history row: loss, loss_id, loss_outlier (CnC only), train_acc
    (argmax over the first K), lr, seconds, device, precision. The loss sums stay on the device
    (float64) and are read once per epoch; the progress bar reads the loss every 25 steps.
    """
    from tqdm.auto import tqdm


    images, labels = _check_data(images, labels, config)
    dev = resolve_device(device)
    prec = resolve_precision(dev, precision)
    config = _complete(config, images, labels, dev, prec)
    cuda = dev.type == "cuda"
    out = claim_folder(out, CHECKPOINT_KIND)
    prev = _check_folder(out, config)
    gone = _remove_leftovers(out, prev)
    if gone and log:
        log(f"removed what a killed run left in {out}: {', '.join(gone)}")
    torch.manual_seed(config.seed)
    model = build_model(config)
    state = {"epochs_done": 0, "history": []}
    if prev is not None:
        _load_weights(model, out / str(prev.get("checkpoint")) / "model.safetensors")
        state = {k: prev[k] for k in ("epochs_done", "history")}
    model.to(dev)
    if cuda:
        model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    scaler = _scaler(prec)
    if prev is not None:
        ck = out / prev["checkpoint"]
        opt_meta = _read_json(ck / "optimizer.json", "optimizer state")
        try:
            opt.load_state_dict(_optimizer_from_files(load_tensors(ck / "optimizer.safetensors", device=str(dev)), opt_meta))
        except (KeyError, ValueError, RuntimeError) as exc:
            raise InputError(f"{ck}: optimizer state that does not fit the model ({exc})") from None
        if scaler.is_enabled() and "scaler" in opt_meta:
            scaler.load_state_dict(opt_meta["scaler"])
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
        # running sums on the device (float64, as the per-step Python sums were): no host sync per step
        sums = torch.zeros(4, dtype=torch.float64, device=dev)  # loss, loss_id, loss_outlier, correct
        seen = 0
        loader = step_loader(images, labels, config, epoch, workers=workers, pin_memory=cuda)
        bar = tqdm(loader, desc=f"epoch {epoch + 1}/{config.epochs}", unit="batch", disable=not progress, leave=False)
        for step, batch in enumerate(bar):
            x = batch["x"].to(dev, non_blocking=True)
            y = batch["y"].to(dev, non_blocking=True)
            n = len(batch["y"])
            if config.cnc:
                x = torch.cat([x, batch["outliers"].to(dev, non_blocking=True)])
            if cuda:
                x = x.contiguous(memory_format=torch.channels_last)
            logits = _forward(model, x, prec)
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
            if scaler.is_enabled():  # fp16: GradScaler.step reads its inf check (one sync per step)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            with torch.no_grad():
                parts = torch.stack([loss.detach(), loss_id.detach(), loss_syn.detach()]).double() * n
                sums += torch.cat([parts, (logit_id[:, :K].argmax(1) == y).sum().double().reshape(1)])
            seen += n
            if progress and step % 25 == 0:
                bar.set_postfix(loss=f"{loss.item():.3f}")
        total = sums.tolist()
        row = {
            "epoch": epoch + 1,
            "loss": total[0] / seen,
            "loss_id": total[1] / seen,
            "train_acc": total[3] / seen,
            "lr": lr,
            "seconds": round(time.time() - t0, 3),
            "device": str(dev),
            "precision": prec,
        }
        if config.cnc:
            row["loss_outlier"] = total[2] / seen
        state["history"].append(row)
        state["epochs_done"] = epoch + 1
        save_checkpoint(out, model, opt, config, state, scaler)
        if log:
            log(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    return _read_progress(out) if (out / "progress.json").is_file() else state


# ---------------------------------------------------------------- features


def extract_in_memory(
    model,
    images: np.ndarray,
    config: CnCTrainConfig,
    labels: np.ndarray | None = None,
    batch_size: int = 256,
    meta: dict | None = None,
    device: str = "cpu",
    precision: str = "fp32",
):
    """One forward pass -> :class:`oodeval.features.FeatureSet` (pre-logit features, all logits,
    the linear head when the classifier is ``nn.Linear``). ``meta`` records ``cnc``,
    ``num_id_classes`` (K), ``outlier_class`` (K for a CnC model, else None), and the ``device``
    and ``precision`` of this pass. The trunk runs under autocast in ``precision``
    (:func:`resolve_precision`; default fp32, "auto" picks as in training), the head in float32;
    channels_last on CUDA."""

    images = np.asarray(images)
    dev = resolve_device(device)
    prec = resolve_precision(dev, precision)
    model.to(dev)
    if dev.type == "cuda":
        model.to(memory_format=torch.channels_last)
    feats, logits = [], []
    model.eval()
    with torch.no_grad():
        for start in range(0, len(images), batch_size):
            x = to_tensor(images[start : start + batch_size], config.mean, config.std).to(dev)
            if dev.type == "cuda":
                x = x.contiguous(memory_format=torch.channels_last)
            with _autocast(dev, prec):
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
        "device": dev.type,
        "precision": prec,
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
