"""``oodeval demo``: the embedded default job - a real OOD benchmark end to end on offline data.

Builds Fashion-MNIST-6 vs held-out classes, digits, photo crops and noise (docs/demo.md), trains a
small timm convnet on the CPU, then runs the ordinary experiment grid (extraction with NAC taps,
all 21 detectors, metrics with 95% CIs) and report, and prints one table per OOD set.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import InputError
from ._options import add_out, add_progress

HELP = "run the embedded default benchmark end to end (Fashion-MNIST, offline)"
EXAMPLES = [
    "oodeval demo",
    "oodeval demo --quick --out /tmp/demo",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_out(p, "demo output", folder=True, default=Path("demo-out"))
    p.add_argument("--data-root", type=Path, default=None, help="where the demo sets are built (default: OUT/data)")
    p.add_argument("--quick", action="store_true", help="reduced sizes, 2 epochs, 200 draws (well under a minute)")
    p.add_argument("--seed", type=int, default=0, help="seed of data sampling, training, bootstrap and sub-sampling (default 0)")
    p.add_argument("--epochs", type=int, default=None, help="training epochs (default 6; 2 with --quick)")
    p.add_argument("--draws", type=int, default=None, help="bootstrap and sub-sampling draws (default 1000; 200 with --quick)")
    p.add_argument("--subsample-n", type=int, default=None, help="OOD draw size of the sub-sampling table (default 500; 50 with --quick)")
    p.add_argument("--batch-size", type=int, default=256, help="extraction batch size (default 256)")
    p.add_argument("--threads", type=int, default=1, help="torch threads during the run (default 1: robust on a shared CPU; 0 = torch's default)")
    add_progress(p)


def run(args: argparse.Namespace) -> int:
    from ..demo.run import run_demo

    if args.threads < 0:
        raise InputError(f"--threads must be 0 (torch's default) or more, got {args.threads}")
    for name in ("epochs", "draws", "subsample_n"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise InputError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    result = run_demo(
        args.out,
        quick=args.quick,
        seed=args.seed,
        epochs=args.epochs,
        draws=args.draws,
        subsample_n=args.subsample_n,
        data_root=args.data_root,
        batch_size=args.batch_size,
        threads=args.threads or None,
        progress=not args.no_progress,
    )
    if not result.summary.ok:
        print(f"oodeval demo: {result.summary.failed} of {result.summary.total} cells failed (listed above)", file=sys.stderr)
        return 1
    return 0
