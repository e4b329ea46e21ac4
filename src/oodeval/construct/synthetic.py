"""A small generated construction dataset (for tests, demos and trying the web app offline).

``make_synthetic_dataset(folder)`` writes: ``images/*.png`` (16x16, one colour per class plus
noise), ``manifest.csv`` (path,label), ``classes.txt``, ``reannotation.csv`` (path,original_label,
reannotated,flag) where a share of images is unassigned ("uncertain" / "no class") and some are
re-assigned to a neighbouring class, and cached embeddings ``image_emb.npy`` (N, E) aligned with the
manifest and ``text_emb.npy`` (C, E), both l2-normalised. Same seed, same bytes.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["SyntheticDataset", "make_synthetic_dataset"]


@dataclass(frozen=True)
class SyntheticDataset:
    folder: Path
    manifest: Path
    classes: Path
    reannotation: Path
    image_embeddings: Path
    text_embeddings: Path
    class_names: list[str]


def make_synthetic_dataset(
    folder: str | Path,
    n_classes: int = 6,
    per_class: int = 8,
    unassigned: float = 0.25,
    embed_dim: int = 16,
    seed: int = 0,
) -> SyntheticDataset:
    """Write the dataset described in the module docstring and return its file locations."""
    from PIL import Image

    folder = Path(folder)
    rng = np.random.default_rng(seed)
    names = [f"class {chr(ord('a') + i % 26)}{i // 26 or ''}" for i in range(n_classes)]
    colours = rng.integers(0, 256, size=(n_classes, 3))
    text = rng.normal(size=(n_classes, embed_dim))
    text /= np.linalg.norm(text, axis=1, keepdims=True)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    manifest, rean, emb = [], [], []
    for c in range(n_classes):
        for j in range(per_class):
            path = f"images/c{c:02d}_{j:03d}.png"
            pixels = np.clip(colours[c] + rng.normal(0, 20, size=(16, 16, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / path)
            manifest.append((path, c))
            e = text[c] + rng.normal(0, 0.6, size=embed_dim)
            emb.append(e / np.linalg.norm(e))
            u = rng.random()
            if u < unassigned:
                rean.append((path, c, "", "uncertain" if rng.random() < 0.7 else "no class"))
            elif u < unassigned + 0.2:
                rean.append((path, c, f"{c};{(c + 1) % n_classes}", ""))
            elif u < unassigned + 0.3:
                rean.append((path, c, str((c + 2) % n_classes), ""))
            else:
                rean.append((path, c, str(c), ""))
    with open(folder / "manifest.csv", "w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(["path", "label"])
        w.writerows(manifest)
    with open(folder / "reannotation.csv", "w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(["path", "original_label", "reannotated", "flag"])
        w.writerows(rean)
    (folder / "classes.txt").write_text("\n".join(names) + "\n")
    np.save(folder / "image_emb.npy", np.asarray(emb, dtype=np.float32))
    np.save(folder / "text_emb.npy", text.astype(np.float32))
    return SyntheticDataset(folder, folder / "manifest.csv", folder / "classes.txt", folder / "reannotation.csv",
                            folder / "image_emb.npy", folder / "text_emb.npy", names)
