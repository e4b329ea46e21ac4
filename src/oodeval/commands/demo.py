"""``oodeval demo``: the embedded default job."""

from __future__ import annotations

import argparse

import numpy as np

HELP = "run the embedded default benchmark end to end"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    from .metrics import format_metrics

    rng = np.random.default_rng(args.seed)
    id_scores = rng.normal(1.0, 1.0, 5000)
    ood_scores = rng.normal(0.0, 1.0, 655)
    print("Built-in example: ID ~ N(1, 1), OOD ~ N(0, 1)")
    print(format_metrics(id_scores, ood_scores, draws=1000, seed=args.seed))
    return 0
