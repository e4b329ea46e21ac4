"""FeatureSet: everything one (model, dataset) forward pass yields, and its on-disk form.

On disk a FeatureSet is a folder: one ``.npy`` per array (memory-mapped on load) and
``meta.json`` (model, dataset, preprocessing, package versions, shapes, content hash).
Per-sample extra arrays (NAC's per-layer states, patch features, ...) live under ``extras/``.
Writes are atomic: the folder appears complete or not at all.
"""

from __future__ import annotations

import json
import platform
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._io import atomic_folder, hash_arrays
from ..errors import InputError
from .stream import iter_chunks

__all__ = ["FeatureSet", "FIELDS"]

#: what a detector may declare in ``needs``: "features", "logits", "labels", "head"
#: (weight and bias), or "extra:<name>" / "extra:<prefix>*" for named extra arrays.
FIELDS = ("features", "logits", "labels", "head")


def _package_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("oodeval", "numpy", "torch", "timm", "open_clip_torch"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def _row_chunks(arr: np.ndarray, rows: int) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, chunk) over ``arr``: file reads for a memmap (its pages do not pile up in the
    process), views of an in-memory array (no copy)."""
    if isinstance(arr, np.memmap):
        for part, chunk in iter_chunks({"a": arr}, rows):
            yield part.start, chunk["a"]
    else:
        for start in range(0, arr.shape[0], rows):
            yield start, arr[start : start + rows]


def _nonfinite(arrays: dict[str, np.ndarray], chunk_elements: int = 1 << 24) -> list[str]:
    """'NAME has K non-finite values (first in row R)' for each floating array with NaN/inf."""
    out = []
    for name, arr in arrays.items():
        if not np.issubdtype(arr.dtype, np.inexact) or arr.size == 0:
            continue
        rows = max(1, chunk_elements // max(1, arr.size // max(1, arr.shape[0] if arr.ndim else 1)))
        flat = arr.reshape(1, -1) if arr.ndim < 2 else arr
        count, first = 0, None
        for start, chunk in _row_chunks(flat, rows):
            if np.isfinite(chunk.sum()):  # NaN/inf propagate: a finite sum means every value is finite
                continue
            bad = ~np.isfinite(chunk)
            if bad.any():
                per_row = bad.reshape(bad.shape[0], -1).sum(axis=1)
                count += int(per_row.sum())
                first = start + int(np.flatnonzero(per_row)[0]) if first is None else first
        if count:
            where = f" (first in row {first})" if arr.ndim >= 2 else ""
            out.append(f"{name} has {count} non-finite value{'s' if count > 1 else ''}{where}")
    return out


@dataclass
class FeatureSet:
    """One forward pass over one dataset.

    features: (N, D) float32 penultimate features (image embeddings for a VLM).
    logits:   (N, C) or None.
    labels:   (N,) int64, -1 where unknown (OOD sets).
    weight, bias: the classifier head (C, D) and (C,), or None.
    extras:   name -> per-sample array with first axis N (e.g. ``nac/layer4``, ``patch_features``).
    meta:     free JSON metadata (model, dataset, preprocessing, ...).
    """

    features: np.ndarray
    labels: np.ndarray | None = None
    logits: np.ndarray | None = None
    weight: np.ndarray | None = None
    bias: np.ndarray | None = None
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    #: (weight, bias, content hash) of the last head hashed by :meth:`signature`
    _head_hash: tuple | None = field(default=None, init=False, repr=False, compare=False)
    #: array name -> weak reference to the array object :meth:`check_finite` last found free of NaN/inf
    _finite: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.features = np.asarray(self.features)
        if self.labels is None:
            self.labels = np.full(self.features.shape[0] if self.features.ndim else 0, -1, dtype=np.int64)
        self.labels = np.asarray(self.labels)
        self.validate(finite=False)

    def __repr__(self) -> str:
        """Shapes and provenance only (the metadata can run to many kilobytes)."""
        shape = lambda a: None if a is None else tuple(a.shape)  # noqa: E731
        parts = [f"features={shape(self.features)}", f"logits={shape(self.logits)}", f"head={shape(self.weight)}"]
        if self.extras:
            parts.append(f"extras={sorted(self.extras)}")
        parts += [f"{k}={self.meta[k]!r}" for k in ("model", "dataset") if k in self.meta]
        return f"FeatureSet({', '.join(parts)})"

    def __len__(self) -> int:
        return int(self.features.shape[0])

    @property
    def has_head(self) -> bool:
        return self.weight is not None and self.bias is not None

    @property
    def name(self) -> str:
        """How errors name this set: its dataset (or role) from the metadata."""
        return str(self.meta.get("dataset") or self.meta.get("role") or "unnamed")

    def validate(self, finite: bool = True) -> None:
        """Check shapes, and the finiteness of every array (``finite=False``: of the head only, as on
        construction, where a memory-mapped set is not read through); raise ValueError naming each problem."""
        problems = []
        f = self.features
        if f.ndim != 2:
            problems.append(f"features must be (N, D), got shape {f.shape}")
        n = f.shape[0] if f.ndim else 0
        if n == 0:
            problems.append("features has no rows")
        if self.labels.shape != (n,):
            problems.append(f"labels must be ({n},), got {self.labels.shape}")
        elif not np.issubdtype(self.labels.dtype, np.integer):
            problems.append(f"labels must be integers, got dtype {self.labels.dtype}")
        if self.logits is not None and (self.logits.ndim != 2 or self.logits.shape[0] != n):
            problems.append(f"logits must be ({n}, C), got {self.logits.shape}")
        if (self.weight is None) != (self.bias is None):
            problems.append("weight and bias must be given together")
        if self.weight is not None and self.bias is not None:
            if self.weight.ndim != 2 or (f.ndim == 2 and self.weight.shape[1] != f.shape[1]):
                problems.append(f"weight must be (C, {f.shape[-1]}), got {self.weight.shape}")
            if self.bias.shape != (self.weight.shape[0],):
                problems.append(f"bias must be ({self.weight.shape[0]},), got {self.bias.shape}")
            if self.logits is not None and self.logits.shape[1] != self.weight.shape[0]:
                problems.append(f"logits have {self.logits.shape[1]} classes but the head has {self.weight.shape[0]}")
        for name, arr in self.extras.items():
            if arr.ndim == 0 or arr.shape[0] != n:
                problems.append(f"extra '{name}' must have first axis {n}, got shape {arr.shape}")
        if not problems:
            problems = _nonfinite(self._arrays() if finite else {k: v for k, v in self._arrays().items() if k in ("weight", "bias")})
        if problems:
            raise InputError(f"inconsistent FeatureSet {self.name!r}: " + "; ".join(problems))

    def check_finite(self, needs: tuple[str, ...] | list[str], who: str) -> None:
        """Raise ValueError naming the set, each array among ``needs`` (as in :meth:`require`) with
        NaN/inf values and their count; read in chunks, so a memory-mapped set is never loaded whole.

        Each array is read once per array object: one found finite is not read again (every
        detector of a grid scores the same set), one assigned anew is checked again, and one
        changed in place keeps its verdict (as the head hash of :meth:`signature` does)."""
        arrays = self._arrays()
        names = []
        for need in needs:
            if need == "head":
                names += ["weight", "bias"]
            elif need.startswith("extra:"):
                key = "extras/" + need[len("extra:") :]
                names += [k for k in arrays if (k.startswith(key[:-1]) if key.endswith("*") else k == key)]
            elif need != "labels":
                names.append(need)
        checked = lambda k: k in self._finite and self._finite[k]() is arrays[k]  # noqa: E731
        todo = {k: arrays[k] for k in dict.fromkeys(names) if k in arrays and not checked(k)}
        problems = _nonfinite(todo)
        if problems:
            raise InputError(f"{who}: FeatureSet {self.name!r} has non-finite values: " + "; ".join(problems))
        self._finite.update({k: weakref.ref(a) for k, a in todo.items()})

    def signature(self) -> dict[str, object]:
        """What the train, test and OOD sets of one evaluation must share: feature dimension, class
        count, head (shape and content hash), per-sample extras' trailing shapes, and the model
        fingerprint recorded at extraction (model, weights hash, pretrained, model kwargs)."""
        sig: dict[str, object] = {"feature dimension": self.features.shape[1]}
        if self.logits is not None:
            sig["logit classes"] = self.logits.shape[1]
        if self.has_head:
            sig["head"] = f"{tuple(self.weight.shape)} #{self._head_fingerprint()}"
        for k, v in self.extras.items():
            sig[f"extra {k!r} shape"] = tuple(v.shape[1:])
        if "model" in self.meta:
            sig["model"] = json.dumps([self.meta.get(k) for k in ("model", "weights_hash", "pretrained", "model_kwargs")], default=str)
        return sig

    def _head_fingerprint(self) -> str:
        """Content hash of (weight, bias), computed once per pair of head arrays: a head assigned
        anew is hashed again, one changed in place keeps its old hash."""
        cached = self._head_hash
        if cached is None or cached[0] is not self.weight or cached[1] is not self.bias:
            cached = self._head_hash = (self.weight, self.bias, hash_arrays({"w": self.weight, "b": self.bias})[:12])
        return cached[2]

    def check_agrees(self, reference: dict[str, object], reference_name: str, who: str) -> None:
        """Raise ValueError listing every entry of :meth:`signature` that both sets have and that
        differs from ``reference`` (the signature of the set a detector was fitted on)."""
        mine = self.signature()
        diff = [f"{k} {mine[k]} vs {reference[k]}" for k in mine if k in reference and mine[k] != reference[k]]
        if diff:
            raise InputError(f"{who}: FeatureSet {self.name!r} does not match the ID-train set {reference_name!r} it was fitted on: " + "; ".join(diff))

    def require(self, needs: tuple[str, ...] | list[str], who: str = "this detector") -> None:
        """Raise ValueError listing every requirement in ``needs`` this FeatureSet lacks."""
        missing = []
        for need in needs:
            if need == "logits" and self.logits is None:
                missing.append("logits")
            elif need == "head" and not self.has_head:
                missing.append("the classifier head (weight, bias)")
            elif need == "labels" and not (self.labels >= 0).any():
                missing.append("class labels (all are -1)")
            elif need.startswith("extra:"):
                key = need[len("extra:") :]
                if key.endswith("*"):
                    if not any(k.startswith(key[:-1]) for k in self.extras):
                        missing.append(f"extra arrays '{key}' (extract with --taps)")
                elif key not in self.extras:
                    missing.append(f"extra array '{key}'")
            elif need not in FIELDS:
                raise InputError(f"unknown requirement {need!r}")
        if missing:
            src = self.meta.get("dataset", "this FeatureSet")
            raise InputError(f"{who} needs {', '.join(missing)}, which {src} does not have")

    def extras_with_prefix(self, prefix: str) -> dict[str, np.ndarray]:
        """Extra arrays whose names start with ``prefix``, in sorted name order."""
        return {k: self.extras[k] for k in sorted(self.extras) if k.startswith(prefix)}

    def subset(self, index: np.ndarray | slice) -> FeatureSet:
        """Rows ``index`` of every per-sample array; head and metadata shared."""
        return FeatureSet(
            features=self.features[index],
            labels=self.labels[index],
            logits=None if self.logits is None else self.logits[index],
            weight=self.weight,
            bias=self.bias,
            extras={k: v[index] for k, v in self.extras.items()},
            meta=dict(self.meta),
        )

    def _arrays(self) -> dict[str, np.ndarray]:
        arrays = {"features": self.features, "labels": self.labels}
        for name in ("logits", "weight", "bias"):
            if getattr(self, name) is not None:
                arrays[name] = getattr(self, name)
        for name, arr in self.extras.items():
            arrays[f"extras/{name}"] = arr
        return arrays

    def content_hash(self) -> str:
        """Hash of every array's dtype, shape and bytes."""
        return hash_arrays(self._arrays())

    def save(self, path: str | Path) -> Path:
        """Write the folder atomically and return its path.

        An existing ``path`` is replaced only when it carries oodeval's FeatureSet marker and holds
        nothing but the files that marker lists (unchanged); any other file or folder there (a
        FeatureSet folder copied without its marker included) is refused with
        :class:`oodeval._io.OutputPathError`.
        """
        path = Path(path)
        arrays = self._arrays()
        meta = dict(self.meta)
        meta.update(
            format="oodeval.FeatureSet/1",
            n=len(self),
            shapes={k: list(v.shape) for k, v in arrays.items()},
            dtypes={k: v.dtype.str for k, v in arrays.items()},
            content_hash=hash_arrays(arrays),
        )
        meta.setdefault("versions", _package_versions())
        with atomic_folder(path, "FeatureSet") as tmp:
            tmp.mkdir()
            for name, arr in arrays.items():
                out = tmp / f"{name}.npy"
                out.parent.mkdir(parents=True, exist_ok=True)
                np.save(out, np.ascontiguousarray(arr))
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n")
        self.meta = meta
        return path

    @classmethod
    def load(cls, path: str | Path, mmap: bool = True, verify: bool = True) -> FeatureSet:
        """Load a saved folder; arrays are memory-mapped unless ``mmap=False``.

        ``verify`` (default): the arrays' content hash is recomputed and must equal the one
        ``meta.json`` recorded when the folder was written (one read of every array, about 1 s per
        GB; see docs/extraction.md), so changed bytes are an error, never other numbers.
        """
        path = Path(path)
        meta_file = path / "meta.json"
        if not meta_file.is_file():
            raise FileNotFoundError(f"{path} is not a FeatureSet folder (no meta.json)")
        try:
            meta = json.loads(meta_file.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise InputError(f"{meta_file} is not valid JSON ({exc}); the FeatureSet is damaged: extract it again") from exc
        if not isinstance(meta, dict) or not isinstance(meta.get("shapes", {}), dict):
            raise InputError(f"{meta_file} is not a FeatureSet meta.json (no shapes table); extract it again")
        mode = "r" if mmap else None
        arrays: dict[str, np.ndarray] = {}
        missing = []
        for name, shape in meta.get("shapes", {}).items():
            f = path / f"{name}.npy"
            if not f.is_file():
                missing.append(f"{name}.npy")
                continue
            arr = _load_array(f, mode)
            if list(arr.shape) != shape:
                raise InputError(f"{f} has shape {arr.shape} but meta.json records {tuple(shape)}")
            arrays[name] = arr
        if missing:
            raise InputError(f"FeatureSet {path} is missing {', '.join(missing)}")
        if "features" not in arrays:
            raise InputError(f"FeatureSet {path} records no features array")
        if verify and meta.get("content_hash") and hash_arrays(arrays) != meta["content_hash"]:
            raise InputError(f"FeatureSet {path}: its arrays do not match the content hash meta.json recorded when they were "
                             "written (a file was changed or damaged); extract or copy it again")
        return cls(
            features=arrays["features"],
            labels=arrays.get("labels"),
            logits=arrays.get("logits"),
            weight=arrays.get("weight"),
            bias=arrays.get("bias"),
            extras={k[len("extras/") :]: v for k, v in arrays.items() if k.startswith("extras/")},
            meta=meta,
        )


def _load_array(f: Path, mode: str | None) -> np.ndarray:
    """``np.load`` of one FeatureSet array, a damaged or foreign file an error naming it."""
    try:
        return np.load(f, mmap_mode=mode, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        why = "holds Python objects (pickled data), not numbers" if "pickle" in str(exc) or "Python objects" in str(exc) else f"is not a readable .npy array ({exc})"
        raise InputError(f"{f} {why}; the FeatureSet is damaged: extract it again") from exc
