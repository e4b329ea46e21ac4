"""What NAC's taps cost, and what tapping only NAC's fitting rows saves (issue 14, item 1).

Extracts the same JPEG folder (``--classes`` x ``--per-class`` images) three ways and reports the
extraction loop's images/s from each entry's ``meta.json`` (model build excluded):
  plain    features + logits (inference mode);
  taps     plus NAC's states: a forward with hooks and a backward pass per image;
  nac-fit  taps on the ``--n-fit`` class-balanced rows NAC fits on only (``extract_nac_fit``).
Then projects, from the measured per-image times, extracting ImageNet-1k train (1,281,167
images) for a ResNet (n_fit 1000) and a ViT (n_fit 50,000): all rows tapped, against the
plain pass plus only NAC's fitting rows tapped.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from extract import make_jpegs  # noqa: E402  (benchmarks/extract.py)

IMAGENET_TRAIN = 1_281_167


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--size", type=int, default=224, help="input resolution")
    ap.add_argument("--classes", type=int, default=4)
    ap.add_argument("--per-class", type=int, default=32)
    ap.add_argument("--n-fit", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    from oodeval.features.extract import extract, extract_nac_fit

    kw = {"num_classes": 1000, "pretrained_cfg_overlay": {"input_size": (3, args.size, args.size)}}
    opts = {"model_kwargs": kw, "batch_size": args.batch_size, "device": args.device, "progress": False}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        for c in range(args.classes):
            make_jpegs(data / f"c{c}", args.per_class, (args.size + 32, args.size + 32), seed=c)
        store = Path(tmp) / "store"
        paths = {
            "plain": extract(args.model, data, store, **opts),
            "taps": extract(args.model, data, store, taps=True, **opts),
            "nac-fit": extract_nac_fit(args.model, data, store, n_fit=args.n_fit, seed=0, **opts),
        }
        per_image = {}
        for name, path in paths.items():
            t = json.loads((path / "meta.json").read_text())["timing_rank0"]
            per_image[name] = t["seconds"] / t["images"]
            print(f"{name:8s} {t['images']:5d} images  {t['images'] / t['seconds']:8.1f} img/s")
    plain, taps = per_image["plain"], per_image["taps"]
    print(f"a tapped image costs {taps / plain:.2f}x a plain one ({args.model}, {args.size} px, {args.device})")
    for family, n_fit in (("ResNet", 1000), ("ViT", 50_000)):
        full = IMAGENET_TRAIN * taps
        fit = IMAGENET_TRAIN * plain + n_fit * taps
        print(f"ImageNet-1k train, {family} n_fit={n_fit}: all rows tapped {full / 3600:.1f} h, "
              f"plain + fitting rows tapped {fit / 3600:.1f} h ({full / fit:.2f}x less)")


if __name__ == "__main__":
    main()
