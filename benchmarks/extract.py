"""Extraction throughput against the bare model forward (issue 4, item 6).

Generates JPEGs, then measures, with the same model and batch size:
  bare     the model's forward on random tensors already in memory (inference mode), in the
           default memory format and in channels_last (what extract uses for timm models);
  extract  oodeval's extraction loop on the JPEGs (decode, the model's own preprocessing,
           forward, atomic shard writes), from the loop timing extract() records in meta.json,
           and end to end (model build and assembly included).
Target: extract >= 90% of bare for resnet18 at 224 px on CPU.
GPU run: --device cuda --model vit_base_patch16_224 --bf16 --workers 8 --images 4096.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
from PIL import Image


def make_jpegs(folder: Path, n: int, size: tuple[int, int], seed: int = 0) -> None:
    """``n`` JPEGs of smooth random content (so they compress like photos), quality 90."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        small = rng.integers(0, 256, (size[1] // 16, size[0] // 16, 3), dtype=np.uint8)
        img = Image.fromarray(small).resize(size, Image.BICUBIC)
        noise = rng.integers(-12, 13, (size[1], size[0], 3))
        Image.fromarray(np.clip(np.asarray(img, np.int16) + noise, 0, 255).astype(np.uint8)).save(folder / f"{i:06d}.jpg", quality=90)


def bare_forward(model: torch.nn.Module, batch: int, n: int, input_size: tuple[int, ...], device: torch.device, bf16: bool,
                 channels_last: bool = False) -> float:
    """Images/s of ``model(x)`` on random tensors resident on the device (model and x in the given memory format)."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model.to(memory_format=fmt)
    x = torch.randn(batch, *input_size, device=device).contiguous(memory_format=fmt)
    amp = torch.autocast(device_type=device.type, dtype=torch.bfloat16) if bf16 else nullcontext()
    steps = max(1, n // batch)
    with torch.inference_mode(), amp:
        model(x)  # warm-up
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        for _ in range(steps):
            model(x)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return steps * batch / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--image-size", type=int, nargs=2, default=(400, 350), help="generated JPEG width height (ImageNet-like)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast in both measurements")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds; the best of each is reported")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from oodeval.features.backbones import load_backbone
    from oodeval.features.extract import extract

    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "jpegs"
        make_jpegs(data, args.images, tuple(args.image_size))
        bb = load_backbone(args.model).to(device)
        if bb.kind == "timm":
            input_size = tuple(bb.preprocessing["data_config"]["input_size"])
        else:
            size = bb.preprocessing["image_size"]
            input_size = (3, *(size if isinstance(size, list) else [size, size]))
        cl = bb.kind == "timm"  # the extractor runs timm models channels_last
        plain, bares, loops, walls = [], [], [], []
        for r in range(args.repeats):  # interleaved rounds, best of each: the CPU may be shared
            plain.append(bare_forward(bb.model, args.batch_size, args.images, input_size, device, args.bf16, False))
            bares.append(bare_forward(bb.model, args.batch_size, args.images, input_size, device, args.bf16, cl))
            t = time.perf_counter()
            path = extract(args.model, data, Path(tmp) / f"store{r}", batch_size=args.batch_size, num_workers=args.workers,
                           device=args.device, amp=args.bf16, progress=False)
            walls.append(args.images / (time.perf_counter() - t))
            timing = json.loads((path / "meta.json").read_text())["timing_rank0"]
            loops.append(timing["images"] / timing["seconds"])
            print(f"  round {r + 1}: bare {plain[-1]:.1f} img/s, bare channels_last {bares[-1]:.1f} img/s, "
                  f"extraction loop {loops[-1]:.1f} img/s", flush=True)
    bare, loop, wall = max(max(bares), max(plain)), max(loops), max(walls)
    print(f"best of {args.repeats} rounds; model {args.model}, {args.images} JPEGs {args.image_size[0]}x{args.image_size[1]} -> {input_size[1]} px, "
          f"batch {args.batch_size}, workers {args.workers}, device {args.device}, bf16 {args.bf16}, threads {torch.get_num_threads()}")
    print(f"  bare forward on random tensors : {max(plain):8.1f} img/s (default memory format)")
    if cl:
        print(f"  bare forward, channels_last    : {max(bares):8.1f} img/s (the format extract uses for timm models)")
    print("  ratios below are against the faster of the two")
    print(f"  extraction loop (JPEG -> store): {loop:8.1f} img/s  = {100 * loop / bare:5.1f}% of bare")
    print(f"  extract() end to end           : {wall:8.1f} img/s  = {100 * wall / bare:5.1f}% of bare "
          f"(model build, shard writes and assembly included)")


if __name__ == "__main__":
    main()
