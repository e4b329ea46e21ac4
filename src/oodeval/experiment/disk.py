"""``run --check``: the disk the zero-shot models' extraction writes into the store, against its free space.

A zero-shot entry holds per image: the embedding (E x 4 bytes, float32), labels and manifest index
(8 + 8), one float64 per GL-MCM patch readout (``features.patchreadout``: the ID names at each gl_mcm
tau), with ``full_patch_features`` the value-path patch tokens (P x E x 2, float16), the manifest's
fine_grained / split columns when it has them, and its ``manifest.csv`` row; plus ~8 KiB of metadata
(and the class names) per entry. While an entry is assembled its shards and a second copy of its arrays
are on disk too (``features.store.assemble``), so the peak is the sum of the entries plus twice the
largest. A named dataset not yet under the data root counts with the registry's expected image count
and a 160-byte manifest row. E and P come from the open_clip model config (P = (image size / patch size)^2; a timm tower's
patch size from its ``patch<k>`` name) or a ``transformers`` config.json (a local folder, or the local
Hugging Face cache); a model whose config cannot be read offline is reported as unknown. Entries already
in the store are counted as new, and supervised models are not estimated.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from .._extras import optional
from ..data import resolve
from ..data.datasets import REGISTRY
from ..features.names import parse_model_name
from .config import ExperimentConfig, ModelSpec
from .zeroshot import gl_mcm_taus

__all__ = ["ModelDisk", "tower_shape", "estimate_disk", "free_bytes", "disk_problem", "format_bytes"]

#: metadata per entry besides the class names (meta.json, .npy headers, marker), a rounded-up figure
_META = 8192
#: manifest.csv bytes per row of a dataset not yet on disk (absolute path, label, columns), a rounded-up figure
_ROW = 160


@dataclass
class ModelDisk:
    """What one zero-shot model's extraction writes: bytes per image, images, total and peak, or why unknown."""

    label: str
    per_image: int | None = None
    images: int = 0
    total: int = 0
    largest: int = 0
    readouts: int = 0
    full: bool = False
    #: bytes per image of the full float16 patch tokens (P x E x 2), written only with ``full_patch_features``
    patch_tokens: int = 0
    unknown: str | None = None
    unresolved: int = 0
    expected: int = 0

    @property
    def peak(self) -> int:
        return self.total + 2 * self.largest


def format_bytes(n: float) -> str:
    """``n`` bytes in decimal units, 3 significant digits."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    raise AssertionError


def _hf_config(name: str) -> dict | None:
    path = Path(name) / "config.json"
    if not path.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(name, "config.json")
        except Exception:  # noqa: BLE001 - an invalid repo id or no cache: unknown
            return None
        if not isinstance(found, str):
            return None
        path = Path(found)
    return json.loads(path.read_text())


def tower_shape(model: str) -> tuple[int, int] | None:
    """``(P, E)``: patch tokens per image and embedding dimension of a VLM image tower, from its config; None if unknown offline."""
    kind, name, _ = parse_model_name(model)
    if kind == "hf":
        cfg = _hf_config(name)
        if cfg is None or "projection_dim" not in cfg:
            return None
        vis = cfg.get("vision_config", {})
        return (int(vis["image_size"]) // int(vis["patch_size"])) ** 2, int(cfg["projection_dim"])
    if kind != "open_clip":
        return None
    cfg = optional("open_clip").get_model_config(name)
    if not cfg:
        return None
    vis = cfg["vision_cfg"]
    patch = vis.get("patch_size")
    if patch is None:
        found = re.search(r"patch(\d+)", str(vis.get("timm_model_name", "")))
        patch = found and int(found.group(1))
    size = vis.get("image_size")
    if not patch or not isinstance(size, int):
        return None
    return (size // int(patch)) ** 2, int(cfg["embed_dim"])


def _entry_bytes(manifest, per_image: int) -> int:
    n = len(manifest)
    rows = n * per_image + len(manifest.absolute().to_csv_text().encode())
    if manifest.fine_grained is not None:
        rows += n
    if manifest.split is not None:
        rows += n * 4 * max((len(str(s)) for s in manifest.split), default=1)
    return rows + _META + len(json.dumps(manifest.class_names or []).encode())


def _model_disk(model: ModelSpec, cfg: ExperimentConfig, manifests: dict) -> ModelDisk:
    readouts = len(gl_mcm_taus(model, cfg)) if model.patch_features else 0
    out = ModelDisk(model.label, readouts=readouts, full=model.full_patch_features)
    shape = tower_shape(model.name)
    if shape is None:
        out.unknown = f"the image tower's shape of {model.name!r} cannot be read offline"
        return out
    p, e = shape
    out.patch_tokens = 2 * p * e
    out.per_image = 4 * e + 16 + 8 * readouts + (2 * p * e if model.full_patch_features else 0)
    for role, ds in [("id_test", cfg.id_test)] + [(d.label, d) for d in cfg.ood]:
        if role in model.features:
            continue
        manifest = manifests.get(ds.name)
        if manifest is None:
            count = getattr(REGISTRY.get(ds.name), "count", None)
            if count is None:
                out.unresolved += 1
                continue
            n, size = count, count * (out.per_image + _ROW) + _META
            out.expected += 1
        else:
            n, size = len(manifest), _entry_bytes(manifest, out.per_image)
        out.images += n
        out.total += size
        out.largest = max(out.largest, size)
    return out


def estimate_disk(cfg: ExperimentConfig) -> list[ModelDisk]:
    """One :class:`ModelDisk` per zero-shot model (datasets that do not resolve are counted in ``unresolved``)."""
    models = [m for m in cfg.models if m.kind == "zero-shot"]
    manifests: dict = {}
    for ds in [cfg.id_test, *cfg.ood] if models else []:
        if ds.name not in manifests:
            try:
                manifests[ds.name] = resolve(ds.name, cfg.data_root)
            except (FileNotFoundError, ValueError):
                manifests[ds.name] = None
    return [_model_disk(m, cfg, manifests) for m in models]


def free_bytes(path: Path) -> int:
    """Free bytes on the file system of ``path`` (its nearest existing parent when it does not exist yet)."""
    path = Path(path).absolute()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def describe_disk(row: ModelDisk) -> str:
    """One line of ``run --check``'s disk figures for a model."""
    if row.unknown:
        return f"  {row.label}: extraction disk unknown ({row.unknown})"
    what = f"embedding + {row.readouts} patch readout(s)" + (" + full float16 patch tokens" if row.full else "")
    text = (f"  {row.label}: extraction writes {format_bytes(row.total)} for {row.images:,} images "
            f"({format_bytes(row.per_image)} per image: {what}{'' if row.full else f'; full patch tokens would add {format_bytes(row.patch_tokens)}'}); "
            f"peak {format_bytes(row.peak)}")
    if row.expected:
        text += f"; {row.expected} dataset(s) not on disk yet counted at the registry's image count"
    return text + (f"; {row.unresolved} dataset(s) of unknown size not counted" if row.unresolved else "")


def disk_problem(cfg: ExperimentConfig, rows: list[ModelDisk]) -> str | None:
    """A refusal naming the figures when the store's free space is smaller than the extraction's peak need."""
    need = sum(r.total for r in rows) + 2 * max((r.largest for r in rows), default=0)
    if need == 0:
        return None
    free = free_bytes(cfg.store)
    if free >= need:
        return None
    return (f"the store {cfg.store} has {format_bytes(free)} ({free:,} bytes) free but the zero-shot models' extraction needs "
            f"{format_bytes(need)} ({need:,} bytes; {', '.join(f'{r.label} {format_bytes(r.total)}' for r in rows if r.total)}, plus twice the "
            "largest entry while it is assembled); free disk space or set `store` to a larger disk")
