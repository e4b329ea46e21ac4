"""Store bytes per image and memory of GL-MCM's two patch paths at the real towers' P x E (issue 32).

For each tower shape (P patches x E dims of the paper's VLMs) and each N, a fresh subprocess writes a
zero-shot store entry the way extraction does (``features.store.write_shard`` per 1024-row shard, then
``store.assemble``), from a synthesised patch-token stream: each batch of 64 images takes P random rows of
a fixed pool of 8192 random unit tokens (seeded), so no tower runs (the benchmark is about the reduction
and the store; a tower's own memory is not part of it). Two paths:

- ``readout``: the tokens are reduced by ``features.patchreadout.local_mcm`` against C random unit labels
  at tau = 0.01 and only the (N,) float64 readout is stored (the default of a grid with GL-MCM);
- ``full``: the (N, P, E) tokens are stored as float16 (``extract(patch_features=True)``).

A second fresh subprocess loads the entry (memory-mapped, as the grid does) and scores mcm and gl_mcm
with the grid's path (``experiment.zeroshot.zeroshot_scores``). Each subprocess samples its
``/proc/self/status`` every 20 ms and reports the peak anonymous memory (RssAnon: the process's own
allocations) apart from the peak file-backed memory (RssFile: pages of memory-mapped store files, which
the kernel can drop), and the entry's bytes on disk per image.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/zeroshot_memory.py --towers SigLIP-SO400M --sizes 1000 4000 16000 48000
    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/zeroshot_memory.py --paths full --sizes 500 2000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: (P, E) of the paper's eight VLMs' value-path patch tokens (docs/zeroshot.md)
TOWERS = {
    "CLIP-B/16": (196, 512), "CLIP-L/14": (576, 768), "AIMv2-L": (256, 768), "PE-Core-L/14": (576, 1024),
    "OpenCLIP-H/14": (729, 1024), "MetaCLIP2-H/14": (729, 1024), "SigLIP-SO400M": (729, 1152), "SigLIP2-g": (576, 1536),
}  # fmt: skip
BATCH, SHARD, POOL = 64, 1024, 8192


class _Peak:
    """Peak RssAnon and RssFile (MB) of this process, sampled from /proc/self/status in a thread, and
    their values when it started (after the imports and the token pool: the baseline)."""

    def __init__(self) -> None:
        self.anon = self.file = 0.0
        self.sample()
        self.base = {"base_anon_mb": round(self.anon, 1), "base_file_mb": round(self.file, 1)}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self) -> None:
        fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
        self.anon = max(self.anon, int(fields["RssAnon"].split()[0]) / 1024)
        self.file = max(self.file, int(fields["RssFile"].split()[0]) / 1024)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.sample()

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        self.sample()
        return {"anon_mb": round(self.anon, 1), "file_mb": round(self.file, 1), **self.base}


def _labels(classes: int, e: int):
    import numpy as np

    t = np.random.default_rng(1).standard_normal((classes, e))
    return t / np.linalg.norm(t, axis=1, keepdims=True)


def _write(entry: Path, n: int, p: int, e: int, classes: int, path: str, device: str) -> dict:
    """One store entry of n synthesised images, written shard by shard and assembled as extraction does."""
    import numpy as np
    import torch

    from oodeval.data import Manifest
    from oodeval.features import store as st
    from oodeval.features.patchreadout import PatchReadout, local_mcm

    gen = torch.Generator(device=device).manual_seed(0)
    pool = torch.randn(POOL, e, generator=gen, device=device)
    pool /= pool.norm(dim=1, keepdim=True)
    readout = PatchReadout(_labels(classes, e), 0.01)
    labels = torch.from_numpy(readout.labels).to(device)
    peak = _Peak()
    started = time.process_time()
    partial = entry.parent / ".partial" / entry.name
    partial.mkdir(parents=True)
    for shard, s0 in enumerate(range(0, n, SHARD)):
        s1 = min(n, s0 + SHARD)
        outs: dict[str, list] = {}
        for b0 in range(s0, s1, BATCH):
            b = min(s1, b0 + BATCH) - b0
            tokens = pool[torch.randint(0, POOL, (b, p), generator=gen, device=device)]
            feats = tokens.mean(dim=1)
            outs.setdefault("features", []).append((feats / feats.norm(dim=1, keepdim=True)).cpu().numpy())
            if path == "readout":
                outs.setdefault(readout.name, []).append(local_mcm(tokens, labels, readout.tau).cpu().numpy())
            else:
                outs.setdefault("patch_features", []).append(tokens.half().cpu().numpy())
            del tokens, feats  # one batch of tokens alive at a time, as in extraction
        st.write_shard(st.shard_path(partial, shard), np.arange(s0, s1), {k: np.concatenate(v) for k, v in outs.items()},
                       np.zeros(0, np.int64), [])
    manifest = Manifest(paths=[f"/synthetic/{i:06d}.png" for i in range(n)], labels=np.full(n, -1, np.int64), name=f"synthetic-{n}")
    meta = {"dataset": manifest.name, "patch_readouts": {readout.name: readout.describe()} if path == "readout" else {}}
    st.assemble(partial, -(-n // SHARD), entry, manifest, meta)
    size = sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
    return {"store_bytes_per_image": round(size / n, 1), "cpu_s": round(time.process_time() - started, 1), **peak.stop()}


def _score(entry: Path, classes: int) -> dict:
    import numpy as np

    from oodeval.experiment.config import DetectorSpec
    from oodeval.experiment.zeroshot import zeroshot_scores
    from oodeval.features import FeatureSet, patchreadout  # noqa: F401 - gl_mcm's readout path imports torch

    fs = FeatureSet.load(entry)
    context = {"id_text": _labels(classes, fs.features.shape[1])}
    zeroshot_scores(DetectorSpec("mcm"), {}, FeatureSet(features=context["id_text"][:2]), context)  # lazy imports, before the baseline
    peak = _Peak()
    started = time.process_time()
    out = {name: zeroshot_scores(DetectorSpec(name), {}, fs, context) for name in ("mcm", "gl_mcm")}
    assert all(np.isfinite(s).all() and len(s) == len(fs) for s in out.values())
    return {"cpu_s": round(time.process_time() - started, 1), **peak.stop()}


def _child(args: argparse.Namespace) -> None:
    entry = Path(args.child)
    p, e = TOWERS[args.tower]
    if args.stage == "write":
        res = _write(entry, args.n, p, e, args.classes, args.path, args.device)
    else:
        res = _score(entry, args.classes)
    print(json.dumps(res))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--towers", nargs="+", default=["SigLIP-SO400M"], choices=sorted(TOWERS) + ["all"])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 4000])
    ap.add_argument("--paths", nargs="+", default=["readout"], choices=["readout", "full"])
    ap.add_argument("--classes", type=int, default=1000, help="ID labels C (the readout's cost is N x P x E x C)")
    ap.add_argument("--device", default="cpu", help="where the synthesised tokens are reduced (cpu, cuda)")
    ap.add_argument("--store", type=Path, default=None, help="folder for the temporary entries (default: a temp dir)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--stage", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--tower", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--path", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return _child(args)
    towers = sorted(TOWERS, key=lambda t: TOWERS[t]) if "all" in args.towers else args.towers
    print(f"C={args.classes} labels, tau=0.01, {BATCH}-image batches, {SHARD}-row shards, synthesised tokens on {args.device}; "
          "peak MB of fresh processes (anon = own allocations, file = mapped store pages)")
    print("MB above each process's baseline (after imports, the 8192-token pool, a warm-up score; baselines in the last columns)")
    head = f"{'tower':<15} {'P x E':>10} {'path':<8} {'N':>7} {'B/image':>10} {'write anon':>10} {'write file':>10} " \
           f"{'score anon':>10} {'score file':>10} {'cpu s':>7} {'base anon/file':>15}"
    print(head)
    with tempfile.TemporaryDirectory(dir=args.store) as tmp:
        for tower in towers:
            p, e = TOWERS[tower]
            for path in args.paths:
                for n in args.sizes:
                    entry = Path(tmp) / f"{path}-{p}x{e}-{n}"
                    base = [sys.executable, __file__, "--child", str(entry), "--tower", tower, "--classes", str(args.classes)]
                    run = lambda stage, extra=(): json.loads(subprocess.run(  # noqa: E731
                        base + ["--stage", stage, *extra], capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
                    w = run("write", ["--n", str(n), "--path", path, "--device", args.device])
                    s = run("score")
                    up = lambda r, k: r[f"{k}_mb"] - r[f"base_{k}_mb"]  # noqa: E731
                    print(f"{tower:<15} {f'{p} x {e}':>10} {path:<8} {n:>7} {w['store_bytes_per_image']:>10.1f} {up(w, 'anon'):>10.0f} "
                          f"{up(w, 'file'):>10.0f} {up(s, 'anon'):>10.0f} {up(s, 'file'):>10.0f} {w['cpu_s'] + s['cpu_s']:>7.1f} "
                          f"{w['base_anon_mb']:>7.0f}/{w['base_file_mb']:.0f}", flush=True)
                    shutil.rmtree(entry)  # the entry this run wrote into its own temporary folder


if __name__ == "__main__":
    main()
