"""What the network methods' passes cost per image, relative to a plain forward (issue 31, item 2).

Extracts the same JPEG folder (``--classes`` x ``--per-class`` images) once plainly and once per
network pass (``features.passes``: ODIN, Mahalanobis clean and with input preprocessing, Gram,
RankFeat, MC dropout), each with the release's default settings, into a fresh store, and reports
each extraction's CPU time per image divided by the plain one's, all in one process on one torch
thread (CPU time, not wall time: other processes on the machine do not enter it). Each is the
least of ``--rounds`` interleaved rounds, less the model build (timed alike). The mds pass with
noise perturbs along the Gaussians fitted on the clean pass of the same folder.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from extract import make_jpegs  # noqa: E402  (benchmarks/extract.py)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--size", type=int, default=64, help="input resolution (block 4 of a ResNet is size/32 wide; RankFeat needs 2+)")
    ap.add_argument("--classes", type=int, default=4)
    ap.add_argument("--per-class", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    import torch

    from oodeval.features.backbones import load_backbone
    from oodeval.features.extract import extract
    from oodeval.features.pass_options import parse_pass

    torch.set_num_threads(1)
    kw = {"num_classes": args.classes, "pretrained_cfg_overlay": {"input_size": (3, args.size, args.size)}}
    opts = {"model_kwargs": kw, "batch_size": args.batch_size, "device": "cpu", "progress": False}
    n = args.classes * args.per_class
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        for c in range(args.classes):
            make_jpegs(data / f"c{c}", args.per_class, (args.size, args.size), seed=c)
        clean = extract(args.model, data, Path(tmp) / "fit", passes=[parse_pass("mds", "noise=0")], **opts)  # also the warm-up
        runs = {
            "plain": [],
            "odin (T=1000, eps=0.0014)": [parse_pass("odin", True)],
            "mds clean (5 layers)": [parse_pass("mds", "noise=0")],
            "mds noise=0.0014 (5 layers)": [parse_pass("mds", f"noise=0.0014,fit={clean}")],
            "gram (p=1..10, 5 layers)": [parse_pass("gram", True)],
            "rankfeat (blocks 3, 4; SVD)": [parse_pass("rankfeat", True)],
            "mcd (5 samples, head)": [parse_pass("mcd", True)],
        }
        best: dict[str, float] = {}
        build = float("inf")
        for r in range(args.rounds):
            t0 = time.process_time()
            load_backbone(args.model, model_kwargs=kw)
            build = min(build, time.process_time() - t0)
            for i, (name, passes) in enumerate(runs.items()):
                t0 = time.process_time()
                extract(args.model, data, Path(tmp) / f"store-{r}-{i}", passes=passes, **opts)
                best[name] = min(best.get(name, float("inf")), time.process_time() - t0)
    per_image = {name: (sec - build) / n for name, sec in best.items()}
    plain = per_image["plain"]
    print(f"{args.model}, {args.size} px, CPU (1 thread), batch {args.batch_size}, {n} images, least of {args.rounds} rounds")
    print(f"{'pass':30s} {'ms/img':>8s} {'x plain':>8s}")
    for name, sec in per_image.items():
        print(f"{name:30s} {1000 * sec:8.2f} {sec / plain:8.2f}")


if __name__ == "__main__":
    main()
