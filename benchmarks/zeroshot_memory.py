"""Peak memory of zero-shot scoring from the feature store, for growing N (issue 14 item 4).

For each N a FeatureSet of random unit image embeddings (N, E) and patch features (N, P, E) is written
to a temporary store; a fresh subprocess loads it (memory-mapped, as the grid does) and scores it with
the grid's zero-shot path (``experiment.zeroshot.zeroshot_scores``, MCM and GL-MCM over C labels), then
reports its peak RSS (``ru_maxrss``). ``--copy`` runs the former path instead (the whole patch array
made float64 and normalised before scoring) for comparison. The streamed peak stays flat in N.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/zeroshot_memory.py [--sizes 1000 4000 16000] [--copy]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _write_store(folder: Path, n: int, p: int, e: int, seed: int = 0) -> Path:
    """A FeatureSet folder with (n, e) embeddings and (n, p, e) patch features, written in row blocks."""
    import numpy as np
    from numpy.lib.format import open_memmap

    from oodeval.features import FeatureSet

    rng = np.random.default_rng(seed)
    path = folder / f"fs-{n}"
    small = FeatureSet(features=np.ones((1, e), np.float32), extras={"patch_features": np.ones((1, p, e), np.float32)})
    small.save(path)  # writes meta.json; the arrays are replaced below with n rows
    feats = open_memmap(path / "features.npy", "w+", np.float32, (n, e))
    patches = open_memmap(path / "extras" / "patch_features.npy", "w+", np.float32, (n, p, e))
    for s in range(0, n, 1024):
        t = min(n, s + 1024)
        f = rng.standard_normal((t - s, e)).astype(np.float32)
        feats[s:t] = f / np.linalg.norm(f, axis=1, keepdims=True)
        q = rng.standard_normal((t - s, p, e)).astype(np.float32)
        patches[s:t] = q / np.linalg.norm(q, axis=2, keepdims=True)
    feats.flush(), patches.flush()
    del feats, patches
    np.save(path / "labels.npy", np.full(n, -1, np.int64))
    meta = json.loads((path / "meta.json").read_text())
    meta.update(n=n, shapes={"features": [n, e], "labels": [n], "extras/patch_features": [n, p, e]})
    (path / "meta.json").write_text(json.dumps(meta))
    return path


def _child(path: str, classes: int, copy: bool) -> None:
    import resource

    import numpy as np

    from oodeval.experiment.config import DetectorSpec
    from oodeval.experiment.zeroshot import zeroshot_scores
    from oodeval.features import FeatureSet

    fs = FeatureSet.load(path)
    rng = np.random.default_rng(1)
    text = rng.standard_normal((classes, fs.features.shape[1]))
    context = {"id_text": text / np.linalg.norm(text, axis=1, keepdims=True)}
    if copy:  # the former grid path: the whole array to float64, normalised, for every scorer call
        def unit(x):
            x = np.asarray(x, dtype=np.float64)
            return x / np.linalg.norm(x, axis=-1, keepdims=True)

        fs = FeatureSet(features=unit(fs.features), extras={"patch_features": unit(fs.extras["patch_features"])})
    out = {name: zeroshot_scores(DetectorSpec(name), {}, fs, context) for name in ("mcm", "gl_mcm")}
    assert all(np.isfinite(s).all() and len(s) == len(fs) for s in out.values())
    print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 4000, 16000])
    ap.add_argument("--patches", type=int, default=49, help="patches per image (49 = ViT-B/32 at 224 px)")
    ap.add_argument("--dim", type=int, default=64, help="embedding dimension")
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--copy", action="store_true", help="also run the former whole-array float64 path")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return _child(args.child, args.classes, args.copy)
    modes = ["streamed"] + (["whole-array copy"] if args.copy else [])
    print(f"P={args.patches} patches x E={args.dim}, C={args.classes} labels; scorers mcm + gl_mcm; peak RSS of a fresh process")
    print(f"{'N':>8} {'patch array MB':>15} " + " ".join(f"{m + ' MB':>20}" for m in modes))
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            path = _write_store(Path(tmp), n, args.patches, args.dim)
            peaks = []
            for mode in modes:
                cmd = [sys.executable, __file__, "--child", str(path), "--classes", str(args.classes)]
                res = subprocess.run(cmd + (["--copy"] if mode != "streamed" else []), capture_output=True, text=True, check=True)
                peaks.append(json.loads(res.stdout.strip().splitlines()[-1])["peak_rss_mb"])
            size = n * args.patches * args.dim * 4 / 2**20
            print(f"{n:>8} {size:>15.0f} " + " ".join(f"{p:>20.0f}" for p in peaks))
            for f in path.rglob("*.npy"):
                f.unlink()


if __name__ == "__main__":
    main()
