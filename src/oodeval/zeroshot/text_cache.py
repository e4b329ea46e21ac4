"""On-disk cache of label embeddings, keyed by (model, weights, template set, label).

One folder per (model, weights, template set) key under the cache root, holding ``meta.json`` and
append-only shards ``shard-NNNNNN-<hash>.npz`` (``labels``: str array, ``embeddings``: float32 (n, E)),
each written atomically. A label is encoded once per key: a growing lexicon adds shards, nothing is
recomputed, and an interrupted encoding resumes from the last complete shard.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .._io import atomic_path, hash_json, write_json_atomic
from ..errors import InputError

__all__ = ["TextEmbeddingCache"]


class TextEmbeddingCache:
    """``TextEmbeddingCache(root, key: dict)``: ``get(labels) -> (found mask, rows)``, ``add(labels, emb)``."""

    def __init__(self, root: str | Path, key: dict) -> None:
        self.key = dict(key)
        self.folder = Path(root) / hash_json(self.key)
        self._index: dict[str, tuple[int, int]] = {}
        self._shards: list[np.ndarray] = []
        self._load()

    def _load(self) -> None:
        meta = self.folder / "meta.json"
        if meta.is_file() and json.loads(meta.read_text())["key"] != json.loads(json.dumps(self.key)):
            raise InputError(f"cache folder {self.folder} belongs to another key (hash collision?)")
        for path in sorted(self.folder.glob("shard-*.npz")):
            with np.load(path, allow_pickle=False) as z:
                labels, emb = z["labels"], z["embeddings"]
            shard = len(self._shards)
            self._shards.append(emb)
            for row, label in enumerate(labels.tolist()):
                self._index.setdefault(label, (shard, row))

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, label: str) -> bool:
        return label in self._index

    def get(self, labels: list[str]) -> np.ndarray:
        """Embeddings (len(labels), E) float32 of cached labels; KeyError naming the missing ones."""
        missing = [label for label in labels if label not in self._index]
        if missing:
            raise KeyError(f"{len(missing)} labels not in the cache, e.g. {missing[:3]}")
        if not labels:
            dim = self._shards[0].shape[1] if self._shards else 0
            return np.zeros((0, dim), np.float32)
        return np.stack([self._shards[s][r] for s, r in (self._index[label] for label in labels)])

    def add(self, labels: list[str], embeddings: np.ndarray) -> None:
        """Append one shard (atomically) with new labels and their embeddings."""
        embeddings = np.asarray(embeddings, dtype=np.float32)
        if embeddings.shape[0] != len(labels):
            raise InputError(f"{len(labels)} labels but {embeddings.shape[0]} embeddings")
        fresh = [i for i, label in enumerate(labels) if label not in self._index]
        if not fresh:
            return
        labels = [labels[i] for i in fresh]
        embeddings = embeddings[fresh]
        self.folder.mkdir(parents=True, exist_ok=True)
        if not (self.folder / "meta.json").is_file():
            write_json_atomic(self.folder / "meta.json", {"key": self.key, "format": "shard-NNNNNN.npz: labels, embeddings"})
        shard = len(self._shards)
        target = self.folder / f"shard-{shard:06d}-{hash_json(labels)[:12]}.npz"  # unique across writers
        with atomic_path(target) as tmp:
            with open(tmp, "wb") as fh:
                np.savez(fh, labels=np.array(labels, dtype=str), embeddings=embeddings)
        self._shards.append(embeddings)
        for row, label in enumerate(labels):
            self._index[label] = (shard, row)
