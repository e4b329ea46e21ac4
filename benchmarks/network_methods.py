"""What the network methods' passes cost per image, relative to a plain forward (issue 31, item 2).

Extracts the same JPEG folder (``--classes`` x ``--per-class`` images) once plainly and once per
network pass (``features.passes``: ODIN, Mahalanobis clean and with input preprocessing, Gram,
RankFeat, MC dropout), each with the release's default settings, and reports each entry's
extraction-loop seconds per image (``meta.json`` ``timing_rank0``: image loading, the plain
forward and the pass; model build excluded) divided by the plain entry's, all measured in one run.
The mds pass with noise perturbs along the Gaussians fitted on the clean pass of the same folder.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from extract import make_jpegs  # noqa: E402  (benchmarks/extract.py)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--size", type=int, default=64, help="input resolution (block 4 of a ResNet is size/32 wide; RankFeat needs 2+)")
    ap.add_argument("--classes", type=int, default=4)
    ap.add_argument("--per-class", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    from oodeval.features.extract import extract
    from oodeval.features.pass_options import parse_pass

    kw = {"num_classes": args.classes, "pretrained_cfg_overlay": {"input_size": (3, args.size, args.size)}}
    opts = {"model_kwargs": kw, "batch_size": args.batch_size, "device": args.device, "progress": False}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        for c in range(args.classes):
            make_jpegs(data / f"c{c}", args.per_class, (args.size, args.size), seed=c)
        store = Path(tmp) / "store"
        extract(args.model, data, Path(tmp) / "warm-up", **opts)  # thread pools and caches warm before anything is timed
        clean = extract(args.model, data, store, passes=[parse_pass("mds", "noise=0")], **opts)
        runs = {
            "plain": [],
            "odin (T=1000, eps=0.0014)": [parse_pass("odin", True)],
            "mds clean (5 layers)": [parse_pass("mds", "noise=0")],
            "mds noise=0.0014 (5 layers)": [parse_pass("mds", f"noise=0.0014,fit={clean}")],
            "gram (p=1..10, 5 layers)": [parse_pass("gram", True)],
            "rankfeat (blocks 3, 4; SVD)": [parse_pass("rankfeat", True)],
            "mcd (5 samples, head)": [parse_pass("mcd", True)],
        }
        per_image = {}
        for name, passes in runs.items():
            path = clean if name.startswith("mds clean") else extract(args.model, data, Path(tmp) / f"store-{len(per_image)}", passes=passes, **opts)
            t = json.loads((path / "meta.json").read_text())["timing_rank0"]
            per_image[name] = t["seconds"] / t["images"]
    plain = per_image["plain"]
    print(f"{args.model}, {args.size} px, {args.device}, batch {args.batch_size}, {args.classes * args.per_class} images")
    print(f"{'pass':30s} {'ms/img':>8s} {'x plain':>8s}")
    for name, sec in per_image.items():
        print(f"{name:30s} {1000 * sec:8.2f} {sec / plain:8.2f}")


if __name__ == "__main__":
    main()
