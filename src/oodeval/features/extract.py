"""Extraction: one forward pass of a backbone over a dataset into a cached FeatureSet.

``extract(model, dataset, store)`` loads the images of a manifest with the model's own
preprocessing (DataLoader workers, pinned memory on a GPU, channels_last, bf16 autocast on a GPU),
writes per-shard results atomically and assembles the FeatureSet when every shard is in. The entry
is keyed by model, weights content, probe head, preprocessing inputs (model name, model kwargs,
timm/open_clip/torch versions), manifest content hash and options; a repeated call returns the
finished folder without loading the model. A run killed at any point resumes from its shards.
Unreadable images are skipped, counted and listed in ``meta["skipped"]``. Under torchrun each rank
takes the shards ``i % world_size == rank``; rank 0 assembles once all are in.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from .. import __version__
from .._device import resolve_device
from .._io import hash_json
from ..data import ImageError, Manifest, open_image, resolve
from ..errors import InputError, StateError
from . import store as st
from .backbones import Backbone, file_hash, full_precision, load_backbone, parse_model_name
from .module import module_backbone, module_fingerprint
from .pass_options import KINDS as PASS_KINDS
from .pass_options import PassSpec
from .passes import build_passes, context_of, key_entries
from .patchreadout import PatchReadout, local_mcm
from .preprocess import SplitTransform, split_transform
from .sampling import fit_rows
from .taps import default_nac_layers, describe_readout, nac_roles, vit_depth

__all__ = ["extract", "extract_nac_fit", "entry_key", "ManifestDataset"]

log = logging.getLogger(__name__)

FORMAT = "oodeval.extract/1"
#: how the NAC taps of a ViT-like final norm are read (part of the key of tapped entries)
NAC_READOUT = "classifier-tokens/1"


class ManifestDataset(torch.utils.data.Dataset):
    """Rows of a manifest as ``(transformed image | None, row, error)``; a bad image yields None and its error."""

    def __init__(self, manifest: Manifest, transform: Callable, mode: str = "RGB") -> None:
        self.manifest, self.transform, self.mode = manifest, transform, mode

    def __len__(self) -> int:
        return len(self.manifest)

    def __getitem__(self, i: int) -> tuple[torch.Tensor | np.ndarray | None, int, str]:
        path = self.manifest.resolve_path(i)
        try:
            img = open_image(path, self.mode)
        except ImageError as exc:
            return None, i, str(exc)
        try:
            return self.transform(img), i, ""
        except (OSError, ValueError) as exc:  # e.g. a degenerate (zero-sized) image the transform cannot resize
            return None, i, f"{path}: preprocessing failed: {type(exc).__name__}: {exc}"


def _collate(items: list) -> tuple[torch.Tensor | None, list[int], list[int], list[str]]:
    good = [(x, i) for x, i, _ in items if x is not None]
    bad = [(i, e) for x, i, e in items if x is None]
    if not good:
        x = None
    elif isinstance(good[0][0], np.ndarray):  # uint8 HWC from a SplitTransform
        x = torch.from_numpy(np.stack([g[0] for g in good]))
    else:
        x = torch.stack([g[0] for g in good])
    return x, [g[1] for g in good], [b[0] for b in bad], [b[1] for b in bad]


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {p: version(p) for p in ("torch", "timm", "open_clip_torch")} | {"oodeval": __version__}


def entry_key(model: str, manifest: Manifest, *, weights_hash: str | None, head_hash: str | None, pretrained: bool,
              model_kwargs: dict | None, taps: bool, nac_layers: Sequence[str] | None, patch_features: bool,
              precision: str, module: dict | None = None, full_image_hash: bool = False,
              patch_readouts: Sequence[PatchReadout] = (), passes: Sequence[dict] = ()) -> str:
    """Cache key: hash of everything that determines the stored numbers (not batch size or workers).

    ``module``: for an ``nn.Module``, how features and logits are read from it (head, feature layer,
    transform); its parameters enter through ``weights_hash``. The images enter by content
    (:meth:`Manifest.images_digest`: size, mtime and sampled bytes, or every byte with
    ``full_image_hash``), so an image replaced in place is extracted again. ``patch_readouts``: each
    one's label-set fingerprint and tau (``PatchReadout.describe``), so other labels or another tau make
    a new entry. ``passes``: the network passes' settings (``features.passes.key_entries``).
    """
    key = {
        "format": FORMAT, "model": model, "weights": weights_hash, "head": head_hash, "pretrained": pretrained,
        "model_kwargs": model_kwargs or {}, "manifest": manifest.content_hash(), "taps": taps,
        "images": manifest.images_digest(full=full_image_hash),
        "nac_layers": list(nac_layers) if nac_layers else None, "patch_features": patch_features,
        "precision": precision, "versions": _versions(),
    }
    if taps:  # ViT-like final norms are read at the classifier's token(s) since then (features.taps)
        key["nac_readout"] = NAC_READOUT
    if module is not None:
        key["module"] = module
    if patch_readouts:
        key["patch_readouts"] = [r.describe() for r in patch_readouts]
    if passes:
        key["passes"] = list(passes)
    return hash_json(key)


def _dist_info() -> tuple[int, int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0"))


def _rank_device(device: str, local_rank: int, world: int) -> torch.device:
    """:func:`oodeval._device.resolve_device`, on this process's GPU when torchrun started several."""
    dev = resolve_device(device)
    if dev.type == "cuda" and dev.index is None and world > 1:
        dev = torch.device("cuda", local_rank)
    return dev


def _init_dist(world: int, dev: torch.device) -> bool:
    """Join the process group torchrun set up (nccl on a GPU, gloo on CPU); True if we created it."""
    if world <= 1 or dist.is_initialized():
        return False
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    return True


class _Runner:
    """Per-batch computation: features, logits, and optionally NAC states, patch readouts or patch features
    (the full tensor, float16)."""

    def __init__(self, bb: Backbone, dev: torch.device, amp: bool, layers: list[str] | None, patch_features: bool,
                 split: SplitTransform | None, readouts: Sequence[PatchReadout] = (), passes: Sequence = (),
                 pass_context=None) -> None:
        self.bb, self.dev, self.layers, self.patch, self.split = bb, dev, layers, patch_features, split
        self.passes, self.ctx = list(passes), pass_context
        self.readouts = [(r.name, torch.from_numpy(r.labels).to(dev), r.tau) for r in readouts]
        self.amp = torch.autocast(device_type=dev.type, dtype=torch.bfloat16) if amp else nullcontext()
        self.channels_last = bb.kind == "timm"
        if self.channels_last:
            bb.model.to(memory_format=torch.channels_last)

    def __call__(self, x: torch.Tensor, first_row: int = 0) -> dict[str, np.ndarray]:
        x = x.to(self.dev, non_blocking=True)
        if self.split is not None:
            x = self.split.finish(x, self.channels_last)
        elif self.channels_last and x.ndim == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        if self.layers:
            out = self._with_taps(x)
        else:
            with torch.inference_mode(), self.amp:
                if self.patch or self.readouts:
                    from .valuepath import image_and_patch_features

                    feats, patches = image_and_patch_features(self.bb.model, x)
                    out = {"features": feats.float(), "logits": self.bb.logits_from(feats.float())}
                    with full_precision(patches):
                        patches = patches.float()
                        out |= {name: local_mcm(patches, labels, tau) for name, labels, tau in self.readouts}
                    if self.patch:
                        out["patch_features"] = patches.half()
                else:
                    out = dict(self.bb.forward(x))
        if self.passes:
            out |= self._passes(x, first_row)
        return {k: _host(k, v) for k, v in out.items() if v is not None}

    def _passes(self, x: torch.Tensor, first_row: int) -> dict[str, torch.Tensor]:
        """The network passes (``features.passes``) on this batch, float32 with autocast off."""
        out: dict[str, torch.Tensor] = {}
        with torch.autocast(device_type=self.dev.type, enabled=False):
            for p in self.passes:
                out |= p(self.ctx, x.float(), first_row)
        return out

    def _classifier(self) -> torch.nn.Module | None:
        """NAC's head: a module backbone's own, the probe as a Linear (its gradient flows from the
        probe's logits), or None for timm's ``get_classifier()``."""
        if self.bb._probe is None:
            return getattr(self.bb, "classifier", None)
        w, b = self.bb._probe
        head = torch.nn.Linear(w.shape[1], w.shape[0], device=w.device)
        with torch.no_grad():
            head.weight.copy_(w)
            head.bias.copy_(b)
        return head.requires_grad_(False)

    def _with_taps(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        from .taps import forward_with_nac

        with self.amp:
            res = forward_with_nac(self.bb.model, x, self.layers, self._classifier())
        out = {"features": res.features, "logits": res.logits}
        out.update({f"nac/{k}": v for k, v in res.states.items()})
        return out


def _host(name: str, v: torch.Tensor) -> np.ndarray:
    """A batch output on the host: float32, except readouts (float64) and full patch features (float16)."""
    if name.startswith("patch_readout/") or name == "patch_features":
        return v.detach().cpu().numpy()
    return v.detach().float().cpu().numpy()


def extract(
    model: str | torch.nn.Module,
    dataset: str | os.PathLike | Manifest,
    store: str | os.PathLike,
    *,
    weights: str | os.PathLike | None = None,
    data_root: str | os.PathLike | None = None,
    taps: bool = False,
    patch_features: bool = False,
    batch_size: int = 64,
    num_workers: int = 0,
    device: str = "auto",
    model_kwargs: dict | None = None,
    progress: bool = True,
    head: str | os.PathLike | None = None,
    pretrained: bool = False,
    amp: bool | None = None,
    strict: bool = True,
    shard_size: int = 1024,
    nac_layers: Sequence[str] | None = None,
    transform: Callable | None = None,
    classifier: str | None = None,
    feature_layer: str | None = None,
    image_mode: str = "RGB",
    skip_missing: bool = False,
    full_image_hash: bool = False,
    patch_readouts: Sequence[PatchReadout] = (),
    passes: Sequence[PassSpec] = (),
    cached_only: bool = False,
) -> Path | None:
    """Extract ``model`` on ``dataset`` into ``store`` and return the FeatureSet folder (cached).

    ``dataset``: a Manifest, registry name, ``NAME:SPLIT``, image folder or CSV (see
    :func:`oodeval.data.resolve`). ``taps``: record NAC states (``extras['nac/<layer>']``, layers
    from :func:`oodeval.features.taps.default_nac_layers` unless ``nac_layers``). ``patch_readouts``:
    GL-MCM's local score per image for each given (label set, tau), from the VLM value-path patch tokens
    (``features.patchreadout``; float64 (N,) extras, in the cache key). ``patch_features``: also the full
    value-path patch tokens (``extras['patch_features']`` (N, P, E), float16, error bound in
    ``features.patchreadout``; only when asked: P x E x 2 bytes per image). ``head``: a probe head
    file whose logits/weight/bias replace the model's own. ``amp``: bf16 autocast, default on CUDA only.
    ``shard_size``: rows per shard for a new entry (a resumed entry keeps its own). A manifest row
    whose file does not exist is a FileNotFoundError unless ``skip_missing`` (then it is skipped and
    listed like an unreadable image). The cache key holds the images' content digest (size, mtime,
    sampled bytes; every byte with ``full_image_hash``), so a changed image is a new entry.

    ``model`` may also be a ``torch.nn.Module`` (see :mod:`oodeval.features.module`): then
    ``transform`` (PIL image -> tensor) is required, ``classifier`` names the head module (default:
    the last ``nn.Linear``), ``feature_layer`` optionally names the module whose output is the
    feature, ``image_mode`` is "RGB" or "L"; the cache key holds a hash of its parameters.

    ``passes``: the network passes of ODIN, Mahalanobis with preprocessing, Gram, RankFeat and MC
    dropout (:mod:`oodeval.features.passes`, settings from :func:`~oodeval.features.pass_options.parse_pass`);
    their settings enter the cache key and ``meta["passes"]``, their arrays the extras.

    ``cached_only``: return the entry's folder only when it is already in the store, else None; nothing
    is loaded or extracted (a grid's coordinator decides this way which cells are done). One process
    extracts a given entry at a time: another one asking for it meanwhile waits for it
    (:func:`oodeval.features.store.entry_lock`) and then reads it from the store.
    """
    if batch_size < 1 or shard_size < 1:
        raise InputError(f"batch_size and shard_size must be >= 1, got {batch_size} and {shard_size}")
    backbone = module = None
    if isinstance(model, torch.nn.Module):
        if weights is not None or pretrained or model_kwargs:
            raise InputError("weights, pretrained and model_kwargs apply to model names; load weights into the module yourself")
        backbone = module_backbone(model, transform, head=classifier, feature_layer=feature_layer, image_mode=image_mode)
        module = {k: backbone.preprocessing[k] for k in ("class", "head", "feature_layer", "transform")} | {"image_mode": image_mode}
        model, kind = backbone.name, "module"
    elif transform is not None or classifier is not None or feature_layer is not None:
        raise InputError("transform, classifier and feature_layer apply to an nn.Module model, not to a model name")
    else:
        kind, _, _ = parse_model_name(model)
    patch_readouts = sorted(patch_readouts, key=lambda r: r.name)
    if (patch_features or patch_readouts) and kind not in ("open_clip", "hf"):
        raise InputError("patch_features and patch_readouts apply to VLM image towers only (open_clip:..., hf:...)")
    if len({r.name for r in patch_readouts}) != len(patch_readouts):
        raise InputError("patch_readouts: the same label set and tau are given twice")
    if taps and (kind in ("open_clip", "hf") or (head is not None and kind != "timm")):
        raise InputError("taps (NAC states) need a timm classifier or a timm backbone with a probe head (no VLM)")
    manifest = dataset if isinstance(dataset, Manifest) else resolve(dataset, data_root, strict=strict)
    if len(manifest) == 0:
        raise InputError(f"dataset {manifest.name!r} has no images")
    rank, world, local_rank = _dist_info()
    dev = _rank_device(device, local_rank, world)
    use_amp = (dev.type == "cuda") if amp is None else bool(amp)
    store = Path(store)
    weights_hash = module_fingerprint(backbone.model) if backbone is not None else (
        None if weights is None else st.weights_digest(weights, store))
    head_hash = None if head is None else file_hash(head)
    cache_name = model if kind != "timm" or model.startswith("timm:") else f"timm:{model}"  # 'x' and 'timm:x': one entry
    passes = sorted(passes, key=lambda p: PASS_KINDS.index(p.kind))  # one entry whatever order they are given in
    keyed = [key_entries(p) | ({"batch_size": batch_size, "shard_size": shard_size} if p.kind == "mcd" else {}) for p in passes]
    key = entry_key(cache_name, manifest, weights_hash=weights_hash, head_hash=head_hash, pretrained=pretrained,
                    model_kwargs=model_kwargs, taps=taps, nac_layers=nac_layers, patch_features=patch_features,
                    precision="bf16" if use_amp else "fp32", module=module, full_image_hash=full_image_hash,
                    patch_readouts=patch_readouts, passes=keyed)
    entry = st.entry_path(store, cache_name, manifest.name, key)
    if (entry / "meta.json").is_file():
        log.info("cached: %s", entry)
        return entry
    if cached_only:
        return None
    job = dict(model=model, weights=weights, weights_hash=weights_hash, head=head, pretrained=pretrained,
               model_kwargs=model_kwargs, taps=taps, nac_layers=nac_layers, patch_features=patch_features,
               batch_size=batch_size, num_workers=num_workers, device=dev, amp=use_amp, progress=progress,
               shard_size=shard_size, rank=rank, world=world, backbone=backbone, patch_readouts=patch_readouts,
               random_init=_random_init(kind, weights, pretrained))  # fmt: skip
    # the ranks of one torch.distributed extraction share the entry by design: no lock between them
    with st.entry_lock(store, key) if world == 1 else nullcontext():
        if (entry / "meta.json").is_file():  # extracted by another process while this one waited
            log.info("cached: %s (extracted by another process meanwhile)", entry)
            return entry
        return _extract(entry, key, store, manifest, skip_missing, passes, keyed, **job)


def _extract(entry: Path, key: str, store: Path, manifest: Manifest, skip_missing: bool, passes: list, keyed: list, **job) -> Path:
    """Extract the entry ``entry`` (not in the store yet): check the manifest's files, build the
    passes, run the job (:func:`_run`), on every rank of a torch.distributed group."""
    missing = manifest.missing_files()
    if missing and not skip_missing:
        raise FileNotFoundError(
            f"dataset {manifest.name!r}: {len(missing)} of {len(manifest)} files in the manifest do not exist "
            f"(e.g. {', '.join(missing[:3])}); fix the manifest, or skip them with skip_missing=True / --skip-missing "
            "(then listed in meta.json like unreadable images)"
        )

    built = build_passes(passes)
    for p, k in zip(built, keyed):
        p.keyed = k
    job = _Job(manifest=manifest, store=store, entry=entry, key=key, passes=built, **job)
    rank = job.rank
    created = _init_dist(job.world, job.device)
    try:
        path = _run(job)
        if created:
            dist.barrier()  # no rank tears the group down while another still communicates
        return path
    except BaseException:
        if rank == 0:
            st.discard_unstarted(st.partial_path(store, key))
        raise
    finally:
        if created:
            dist.destroy_process_group()


def extract_nac_fit(
    model: str,
    dataset: str | os.PathLike | Manifest,
    store: str | os.PathLike,
    *,
    n_fit: int | None,
    seed: int = 0,
    data_root: str | os.PathLike | None = None,
    strict: bool = True,
    **options,
) -> Path:
    """NAC's fitting set: only the ID-train rows NAC fits on, extracted with taps (cached).

    NAC's states need a backward pass per image; fitting reads ``n_fit`` class-balanced rows
    (:func:`oodeval.features.sampling.fit_rows` with ``seed``), so only those are tapped, not the whole
    training set. The rows are chosen in manifest order, so they are the rows NAC picks from a
    full tapped extraction of the same manifest when no image is unreadable. Fit NAC on the result
    with the same ``n_fit`` (it holds at most ``n_fit`` rows, all of which are used). ``options``
    are :func:`extract`'s (``taps`` is implied).
    """
    manifest = dataset if isinstance(dataset, Manifest) else resolve(dataset, data_root, strict=strict)
    rows = fit_rows(manifest.labels, n_fit, seed)
    name = f"{manifest.name}.nac-fit-{n_fit}-seed{seed}" if rows.size < len(manifest) else manifest.name
    return extract(model, manifest.subset(rows, name=name), store, taps=True, **options)


def _random_init(kind: str, weights: object, pretrained: bool) -> bool | None:
    """Whether a model name extracts with random weights (``_Job.random_init``)."""
    if kind == "module" or weights is not None or pretrained:
        return False
    return None if kind == "python" else True


@dataclass
class _Job:
    """Everything one extraction run needs (see :func:`extract` for the meaning of each option)."""

    model: str
    manifest: Manifest
    store: Path
    entry: Path
    key: str
    weights: str | os.PathLike | None
    weights_hash: str | None
    head: str | os.PathLike | None
    pretrained: bool
    model_kwargs: dict | None
    taps: bool
    nac_layers: Sequence[str] | None
    patch_features: bool
    batch_size: int
    num_workers: int
    device: torch.device
    amp: bool
    progress: bool
    shard_size: int
    rank: int
    world: int
    backbone: Backbone | None = None
    patch_readouts: Sequence[PatchReadout] = ()
    #: meta ``random_init``: True for a timm / open_clip / hf name with neither weights nor pretrained,
    #: None for a ``module:factory`` (its own business), False otherwise
    random_init: bool | None = False
    #: the network passes (``features.passes.NetPass``)
    passes: Sequence = ()


def _check_text_tower(readouts: Sequence[PatchReadout], bb: Backbone) -> None:
    """Refuse readout labels encoded by another model than the one extracted (text-tower fingerprints)."""
    mine = bb.info.get("text_tower")
    for r in readouts:
        if r.text_tower is not None and mine is not None and r.text_tower != mine:
            raise InputError(f"patch readout {r.label_set!r}: its labels were encoded by a text tower ({r.text_tower[:12]}) "
                             f"other than {bb.name!r}'s ({mine[:12]}); encode them with the model being extracted")


def _run(job: _Job) -> Path:
    from tqdm.auto import tqdm

    manifest, dev, rank, world = job.manifest, job.device, job.rank, job.world
    n = len(manifest)
    partial = st.partial_path(job.store, job.key)
    plan = st.plan(partial, {"key": job.key, "n_rows": n, "shard_size": job.shard_size, "model": job.model, "dataset": manifest.name})
    size = int(plan["shard_size"])
    n_shards = -(-n // size)
    done = st.done_shards(partial)
    mine = [i for i in range(n_shards) if i % world == rank and i not in done]
    timing = {"images": 0, "seconds": 0.0}

    bb = job.backbone or load_backbone(job.model, job.weights, pretrained=job.pretrained, model_kwargs=job.model_kwargs, head=job.head)
    _check_text_tower(job.patch_readouts, bb)
    bb.to(dev)
    split = split_transform(bb.transform)
    layers = None

    depth = vit_depth(bb.model) if bb.kind == "timm" else None
    roles = readout = None
    if job.taps:
        layers = list(job.nac_layers) if job.nac_layers else list(default_nac_layers(bb.model))
        roles = nac_roles(bb.model, layers) if bb.kind == "timm" else {}
        readout = describe_readout(bb.model, layers) if bb.kind == "timm" else {}
    pass_ctx = None
    if job.passes:
        pass_ctx = context_of(bb)
        for p in job.passes:
            p.resolve(pass_ctx)
    if mine:
        if done:
            log.info("resuming %s: %d of %d shards already written", job.entry.name, len(done), n_shards)
        run = _Runner(bb, dev, job.amp, layers, job.patch_features, split, job.patch_readouts, job.passes, pass_ctx)
        batches = [list(range(s, min(s + job.batch_size, stop)))
                   for i in mine for stop in [min((i + 1) * size, n)] for s in range(i * size, stop, job.batch_size)]
        loader = torch.utils.data.DataLoader(
            ManifestDataset(manifest, split or bb.transform, bb.image_mode), batch_sampler=batches, num_workers=job.num_workers,
            collate_fn=_collate, pin_memory=dev.type == "cuda", persistent_workers=False)
        todo = sum(len(b) for b in batches)
        started = time.perf_counter()
        bar = tqdm(total=todo, unit="img", desc=f"extract {manifest.name}", disable=not job.progress or rank != 0, dynamic_ncols=True)
        acc: dict[str, list] = {"rows": [], "failed": [], "errors": []}
        outs: dict[str, list[np.ndarray]] = {}
        skipped = 0
        for x, rows, failed, errors in loader:
            if x is not None:
                for k, v in run(x, min(rows + failed)).items():
                    outs.setdefault(k, []).append(v)
            acc["rows"] += rows
            acc["failed"] += failed
            acc["errors"] += errors
            bar.update(len(rows) + len(failed))
            if failed:
                skipped += len(failed)
                bar.set_postfix(skipped=skipped)
            last = max(rows + failed)
            shard = last // size
            if last + 1 == min((shard + 1) * size, n):
                st.write_shard(st.shard_path(partial, shard), np.array(acc["rows"]),
                               {k: np.concatenate(v) for k, v in outs.items()}, np.array(acc["failed"]), acc["errors"])
                acc = {"rows": [], "failed": [], "errors": []}
                outs = {}
        bar.close()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        timing = {"images": todo, "seconds": round(time.perf_counter() - started, 4)}

    if world > 1:
        dist.barrier()
    error = None
    if rank == 0 and not (job.entry / "meta.json").is_file():  # another process may have finished it meanwhile
        meta = {
            "model": job.model, "weights": None if job.weights is None else str(job.weights),
            "weights_hash": job.weights_hash, "pretrained": job.pretrained, "random_init": job.random_init,
            "model_kwargs": job.model_kwargs or {},
            "head": None if job.head is None else str(job.head),
            "preprocessing": {**bb.preprocessing, "tensor_tail_batched": split is not None},
            "image_mode": bb.image_mode, "dataset": manifest.name,
            "manifest_hash": manifest.content_hash(), "class_names": manifest.class_names, "key": job.key,
            "taps": layers, "nac_roles": roles, "nac_readout": readout, "depth": depth, "patch_features": job.patch_features, "precision": "bf16" if job.amp else "fp32",
            "patch_readouts": {r.name: r.describe() for r in job.patch_readouts},
            "device": dev.type, "world_size": world, "role": manifest.meta.get("role"),
            "timing_rank0": timing, "text_tower": bb.info.get("text_tower"),
        }
        if job.passes:
            meta["passes"] = {p.kind: p.recorded() for p in job.passes}
        try:
            st.assemble(partial, n_shards, job.entry, manifest, meta, head=(bb.weight, bb.bias) if bb.weight is not None else None)
        except (RuntimeError, ValueError) as exc:
            error = str(exc)
    elif rank == 0:  # finished by a concurrent process: the shards this one wrote meanwhile are orphans
        st.discard(partial)
    if world > 1:
        box = [error]
        dist.broadcast_object_list(box, src=0)
        error = box[0]
    if error:
        raise StateError(error)
    return job.entry
