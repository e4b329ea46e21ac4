"""CnC outlier synthesis rate (DataLoader workers) against the training step rate.

Builds the steps of the ``cnc-cifar`` recipe (64 ID + 64 CnC outliers, release pool, source
augmentation) on 32 x 32 RGB photo crops and prints images/s of outlier synthesis for each worker
count, then the images/s one training step consumes on the device (forward + backward + SGD of
the recipe's CIFAR-stem ResNet-34 on 128 images, AMP trunk on CUDA). Synthesis keeps up when its
rate is at least the step rate's outlier half (64 of every 128 images).

    .venv/bin/python benchmarks/cnc_synthesis.py --workers 0 1 2 --steps 6 --device auto
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=6, help="steps timed per measurement")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--model", default="resnet34")
    args = ap.parse_args()

    import numpy as np
    import torch
    from skimage import data, transform

    from oodeval._device import resolve_device
    from oodeval.cnc.corruptions import frost_source
    from oodeval.cnc.loader import step_loader
    from oodeval.cnc.train import CnCTrainConfig, _forward, build_model, resolve_precision

    rng = np.random.default_rng(0)
    photos = [data.astronaut(), data.chelsea(), data.coffee(), data.rocket()]
    crops = []
    for i in range(64 * (args.steps + 2)):
        p = photos[i % len(photos)]
        top, left = rng.integers(0, p.shape[0] - 128), rng.integers(0, p.shape[1] - 128)
        crops.append(transform.resize(p[top : top + 128, left : left + 128], (32, 32), anti_aliasing=True))
    images = np.rint(np.stack(crops) * 255).astype(np.uint8)
    labels = np.arange(len(images)) % 10
    cfg = CnCTrainConfig.recipe("cnc-cifar", num_classes=10, model=args.model)
    print(f"frost: {frost_source()}; {len(images)} images 32x32x3, batch {cfg.batch_size} ID + {cfg.batch_size} outliers")
    for w in args.workers:
        loader = step_loader(images, labels, cfg, epoch=0, workers=w)
        it = iter(loader)
        next(it)  # start-up (worker fork) excluded
        t0 = time.perf_counter()
        n = 0
        for _ in range(args.steps):
            n += len(next(it)["outliers"])
        dt = time.perf_counter() - t0
        print(f"synthesis, {w} worker(s): {n / dt:8.1f} outliers/s  ({1000 * dt / n:.2f} ms per outlier incl. ID augmentation)")
        del it, loader

    dev = resolve_device(args.device)
    amp = dev.type == "cuda"
    prec = resolve_precision(dev)
    model = build_model(cfg).to(dev)
    if amp:
        model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    batch = next(iter(step_loader(images, labels, cfg, epoch=0)))
    x = torch.cat([batch["x"], batch["outliers"]]).to(dev)
    if amp:
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.cat([batch["y"], torch.full((len(batch["outliers"]),), 10)]).to(dev)

    def step():
        loss = torch.nn.functional.cross_entropy(_forward(model, x, prec), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    step()
    if amp:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    if amp:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    rate = args.steps * len(x) / dt
    print(f"training step on {dev}{f' ({prec} trunk)' if amp else ''}, {args.model} CIFAR stem: {rate:8.1f} images/s "
          f"-> needs {rate / 2:.1f} outliers/s; torch threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
