"""What the network methods' passes cost per image, relative to a plain forward (issue 31, item 2).

Extracts the same JPEG folder (``--classes`` x ``--per-class`` images) once plainly and once per
network pass (``features.passes``: ODIN, Mahalanobis clean and with input preprocessing, Gram,
RankFeat, MC dropout, AdaSCALE, i-ODIN), each with the release's default settings, into a fresh store, and reports
each extraction's CPU time per image divided by the plain one's, all in one process on one torch
thread (CPU time, not wall time: other processes on the machine do not enter it). Each is the
least of ``--rounds`` interleaved rounds, less the model build (timed alike). The mds pass with
noise perturbs along the Gaussians fitted on the clean pass of the same folder.

Floors (issue 42): the network work a method cannot avoid beyond the plain extraction, timed on the
same batches as tensors (no decoding): AdaSCALE and i-ODIN one forward + backward (the input
gradient) and one forward (the perturbed input); the deep ensemble of M members M plain
extractions (its combination and scoring are the rest). ``x floor`` = the row's time / (plain + that).
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
    from oodeval import detectors
    from oodeval.features import FeatureSet
    from oodeval.features.ensemble import ensemble_featureset
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
            "adascale (o=0.05)": [parse_pass("adascale", True)],
            "iodin (T=1000, eps=0.0014)": [parse_pass("iodin", True)],
        }
        best: dict[str, float] = {}
        build, grad_step = float("inf"), float("inf")
        tensor = data_tensor(data, args)
        for r in range(args.rounds):
            t0 = time.process_time()
            load_backbone(args.model, model_kwargs=kw)
            build = min(build, time.process_time() - t0)
            for i, (name, passes) in enumerate(runs.items()):
                t0 = time.process_time()
                path = extract(args.model, data, Path(tmp) / f"store-{r}-{i}", passes=passes, **opts)
                best[name] = min(best.get(name, float("inf")), time.process_time() - t0)
                if name == "plain":
                    plain_path = path
            t0 = time.process_time()  # the deep ensemble of two members' stored FeatureSets (beside their plain extractions)
            detectors.create("deep_ensemble").fit().score(ensemble_featureset([FeatureSet.load(clean), FeatureSet.load(plain_path)]))
            best["deep_ensemble (2 members)"] = min(best.get("deep_ensemble (2 members)", float("inf")), time.process_time() - t0)
            grad_step = min(grad_step, _gradient_floor(args.model, kw, tensor, args.batch_size))
    per_image = {name: (sec - (0 if name.startswith("deep") else build)) / n for name, sec in best.items()}
    plain = per_image["plain"]
    per_image["deep_ensemble (2 members)"] += 2 * plain
    floors = {"adascale (o=0.05)": plain + grad_step / n, "iodin (T=1000, eps=0.0014)": plain + grad_step / n,
              "deep_ensemble (2 members)": 2 * plain}  # fmt: skip
    print(f"{args.model}, {args.size} px, CPU (1 thread), batch {args.batch_size}, {n} images, least of {args.rounds} rounds")
    print(f"{'pass':30s} {'ms/img':>8s} {'x plain':>8s} {'x floor':>8s}")
    for name, sec in per_image.items():
        ratio = f"{sec / floors[name]:8.2f}" if name in floors else f"{'':8s}"
        print(f"{name:30s} {1000 * sec:8.2f} {sec / plain:8.2f} {ratio}")


def data_tensor(folder: Path, args: argparse.Namespace):
    """The folder's images as the model's input tensor (decoded once, outside any timing)."""
    import torch
    from PIL import Image

    from oodeval.features.backbones import load_backbone

    bb = load_backbone(args.model, model_kwargs={"num_classes": args.classes, "pretrained_cfg_overlay": {"input_size": (3, args.size, args.size)}})
    return torch.stack([bb.transform(Image.open(p).convert("RGB")) for p in sorted(folder.rglob("*.jpg"))])


def _gradient_floor(model_name: str, kw: dict, x, batch_size: int) -> float:
    """CPU seconds of one forward + backward (the input gradient of the summed max logits) and one
    forward per batch over ``x``: what AdaSCALE's and i-ODIN's passes add to a plain extraction at least."""
    import torch

    from oodeval.features.backbones import load_backbone

    model = load_backbone(model_name, model_kwargs=kw).model
    t0 = time.process_time()
    for start in range(0, len(x), batch_size):
        xb = x[start : start + batch_size].clone().requires_grad_(True)
        f = model(xb)
        (g,) = torch.autograd.grad(f.max(dim=1).values.sum(), xb)
        with torch.no_grad():
            model(xb.detach() + 0.5 * g.sign())
    return time.process_time() - t0


if __name__ == "__main__":
    main()
