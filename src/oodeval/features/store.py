"""The feature store on disk: finished entries, and the shards of an entry still being extracted.

Layout under a store folder::

    <store>/<model slug>/<dataset slug>-<key16>/     a finished FeatureSet (+ manifest.csv of its rows)
    <store>/.partial/<key>/plan.json                 row count and shard size, fixed when the entry is started
    <store>/.partial/<key>/shard-000123.npz          rows [123*S, 124*S) of the manifest, written atomically
    <store>/.partial/<key>.lock                      held (flock) by the one process extracting the entry

A shard is written in one rename, so a process killed at any moment leaves whole shards only;
a rerun skips them, and the entry is assembled (in shard order, rows checked to cover the
manifest exactly once) when every shard is in. ``key`` hashes everything that determines the
numbers: model, weights content, preprocessing inputs, manifest content and options.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:  # not on Windows: extractions there are not locked against each other
    fcntl = None

import numpy as np

from .._io import atomic_folder, atomic_path, write_json_atomic
from ..data.manifest import Manifest
from ..errors import InputError, StateError
from .featureset import FeatureSet

__all__ = ["entry_path", "partial_path", "shard_path", "write_shard", "done_shards", "assemble", "weights_digest", "plan", "entry_lock"]

_SLUG = re.compile(r"[^A-Za-z0-9._+-]+")


def _slug(text: str) -> str:
    return _SLUG.sub("_", text).strip("_") or "x"


def entry_path(store: Path, model: str, dataset: str, key: str) -> Path:
    """Folder of the finished entry for (model, dataset, key)."""
    return Path(store) / _slug(model) / f"{_slug(dataset)}-{key[:16]}"


def partial_path(store: Path, key: str) -> Path:
    return Path(store) / ".partial" / key


def shard_path(partial: Path, i: int) -> Path:
    return partial / f"shard-{i:06d}.npz"


def done_shards(partial: Path) -> set[int]:
    """Indices of the shards already written."""
    return {int(p.stem.split("-")[1]) for p in partial.glob("shard-*.npz")}


def write_shard(path: Path, rows: np.ndarray, arrays: dict[str, np.ndarray], failed: np.ndarray, errors: list[str]) -> None:
    """Write one shard atomically: kept ``rows``, their ``arrays``, and the ``failed`` rows with their errors."""
    payload = {"rows": np.asarray(rows, np.int64), "failed": np.asarray(failed, np.int64),
               "errors": np.array(errors, dtype=np.str_) if errors else np.zeros(0, dtype="<U1")}
    for name, arr in arrays.items():
        payload["a|" + name.replace("/", "|")] = arr
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.savez(fh, **payload)
        fh.flush()
        os.fsync(fh.fileno())


def weights_digest(path: str | Path, store: Path) -> str:
    """Content hash of a weights file, memoised in ``<store>/.partial/weights-hashes.json`` by (path, size, mtime)."""
    from .backbones import file_hash

    path = Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"weights file {path} does not exist")
    st = path.stat()
    memo_file = Path(store) / ".partial" / "weights-hashes.json"
    memo_key = f"{path}|{st.st_size}|{st.st_mtime_ns}"
    try:
        memo = json.loads(memo_file.read_text())
    except (OSError, ValueError):
        memo = {}
    if memo_key not in memo:
        memo[memo_key] = file_hash(path)
        write_json_atomic(memo_file, memo)
    return memo[memo_key]


def assemble(partial: Path, n_shards: int, entry: Path, manifest: Manifest, meta: dict,
             head: tuple[np.ndarray, np.ndarray] | None = None) -> Path:
    """Join every shard into the FeatureSet at ``entry`` (atomically) and remove the partial folder.

    Rows are checked to cover 0..n_rows-1 exactly once (kept or failed). Arrays are joined into
    memory-mapped files, so the entry never has to fit in memory. ``head`` = (weight, bias).
    The entry also holds ``manifest.csv``: the kept rows, in FeatureSet order, with absolute paths;
    extras ``manifest_index`` (each row's manifest index) and, when the manifest has them,
    ``fine_grained`` (bool) and ``split`` (str) per row.
    """
    n_rows = len(manifest)
    missing = [i for i in range(n_shards) if not shard_path(partial, i).is_file()]
    if missing:
        raise StateError(f"entry {entry.name} is incomplete: {len(missing)} of {n_shards} shards missing "
                           f"(first {missing[:5]}); rerun the same command to resume")
    kept_parts, failed_parts, errors = [], [], []
    shapes: dict[str, tuple] = {}
    for i in range(n_shards):
        with np.load(shard_path(partial, i), allow_pickle=False) as z:
            kept_parts.append(z["rows"])
            failed_parts.append(z["failed"])
            errors += [str(e) for e in z["errors"]]
            if not shapes and z["rows"].size:
                shapes = {k: (z[k].shape[1:], z[k].dtype) for k in z.files if k.startswith("a|")}
    kept = np.concatenate(kept_parts)
    failed = np.concatenate(failed_parts)
    seen = np.zeros(n_rows, dtype=np.int64)
    np.add.at(seen, kept, 1)
    np.add.at(seen, failed, 1)
    if (seen != 1).any() or not (np.diff(kept) > 0).all():
        raise StateError(f"shards of {entry.name} do not cover the {n_rows} rows exactly once "
                           f"({int((seen == 0).sum())} missing, {int((seen > 1).sum())} repeated)")
    if kept.size == 0:
        raise InputError(f"none of the {n_rows} images could be read; first errors: {errors[:3]}")
    work = partial / "assembled"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    joined = {k: np.lib.format.open_memmap(work / f"{k}.npy", mode="w+", dtype=dt, shape=(kept.size, *shp))
              for k, (shp, dt) in shapes.items()}
    at = 0
    for i in range(n_shards):
        with np.load(shard_path(partial, i), allow_pickle=False) as z:
            m = z["rows"].size
            for k, mm in joined.items():
                if z[k].shape[0] != m:
                    raise StateError(f"shard {i}: array {k} has {z[k].shape[0]} rows for {m} kept images")
                mm[at : at + m] = z[k]
            at += m
    arrays = {k[2:].replace("|", "/"): mm for k, mm in joined.items()}
    extras = {k: v for k, v in arrays.items() if k not in ("features", "logits")}
    extras["manifest_index"] = kept
    if manifest.fine_grained is not None:
        extras["fine_grained"] = manifest.fine_grained[kept]
    if manifest.split is not None:
        extras["split"] = np.array(manifest.split, dtype=np.str_)[kept]
    meta = dict(meta)
    meta.update(n_manifest=n_rows, n_skipped=int(failed.size),
                skipped=[{"index": int(r), "path": manifest.resolve_path(int(r)), "error": e} for r, e in zip(failed, errors)])
    fs = FeatureSet(features=arrays["features"], labels=manifest.labels[kept], logits=arrays.get("logits"),
                    weight=None if head is None else head[0], bias=None if head is None else head[1],
                    extras=extras, meta=meta)
    with atomic_folder(entry, "FeatureSet") as tmp:
        fs.save(tmp)
        (tmp / "manifest.csv").write_text(manifest.absolute().subset(kept).to_csv_text())
    del joined, arrays, fs
    discard(partial)
    return entry


def discard(partial: Path) -> None:
    """Remove a partial entry (its plan and shards) once its entry is finished, and ``.partial`` once empty."""
    shutil.rmtree(partial, ignore_errors=True)
    _remove_if_empty(partial.parent)


def discard_unstarted(partial: Path) -> None:
    """Remove a partial entry that holds no shard yet (only its plan), and ``.partial`` once it is empty."""
    if not partial.is_dir() or done_shards(partial):
        return
    (partial / "plan.json").unlink(missing_ok=True)
    if _remove_if_empty(partial):
        _remove_if_empty(partial.parent)


def _remove_if_empty(folder: Path) -> bool:
    try:
        folder.rmdir()  # only an empty folder: nothing else is ever removed
    except OSError:
        return False
    return True


def plan(partial: Path, spec: dict) -> dict:
    """The run plan of a partial entry: written once, reused on resume so shard boundaries never move."""
    f = partial / "plan.json"
    if f.is_file():
        old = json.loads(f.read_text())
        if old.get("key") == spec["key"]:
            return old
    write_json_atomic(f, spec)
    return spec



def lock_path(store: Path, key: str) -> Path:
    return Path(store) / ".partial" / f"{key}.lock"


@contextmanager
def entry_lock(store: Path, key: str) -> Iterator[None]:
    """Hold the extraction lock of entry ``key``: an exclusive ``flock`` on ``<store>/.partial/<key>.lock``,
    waiting while another process holds it, so one entry is never extracted twice at once (say, by two
    grid jobs that both miss it). The OS releases the lock of a process that dies, so no lock outlives
    its holder; the holder removes the file when done. Across nodes this needs a shared file system
    with ``flock`` (NFSv4, Lustre or BeeGFS mounted with flock support)."""
    if fcntl is None:
        yield
        return
    path = lock_path(store, key)
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # .partial removed between mkdir and open by a finishing process
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                current = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                current = False
        except BaseException:
            os.close(fd)
            raise
        if current:
            break
        os.close(fd)  # the previous holder removed this file after we opened it: lock the new one
    try:
        yield
    finally:
        path.unlink(missing_ok=True)  # before the lock is released: a waiter then sees a stale inode and retries
        os.close(fd)
        _remove_if_empty(path.parent)
