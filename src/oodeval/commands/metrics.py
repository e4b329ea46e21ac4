"""``oodeval metrics ID OOD``: every metric, with bootstrap 95% CIs, for two score files."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

HELP = "metrics with bootstrap CIs for ID and OOD score files (.npy, or text with one score per line)"
EXAMPLES = [
    "oodeval metrics id_scores.npy ood_scores.npy --draws 1000 --seed 0",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("id_scores", type=Path, help="ID scores, higher = more in-distribution")
    p.add_argument("ood_scores", type=Path, help="OOD scores")
    p.add_argument("--draws", type=int, default=1000, help="bootstrap draws (default 1000)")
    p.add_argument("--seed", type=int, default=0)


def load_scores(path: Path) -> np.ndarray:
    """Scores from a .npy file or a text file of numbers."""
    if not path.is_file():
        raise FileNotFoundError(f"score file {path} does not exist")
    return np.load(path) if path.suffix == ".npy" else np.loadtxt(path, dtype=np.float64, ndmin=1)


def format_metrics(id_scores: np.ndarray, ood_scores: np.ndarray, draws: int, seed: int) -> str:
    """A text table of all metrics with bootstrap percentile 95% CIs."""
    from ..metrics import evaluate
    from ..stats import bootstrap, confidence_interval

    values = evaluate(id_scores, ood_scores)
    boot = bootstrap(id_scores, ood_scores, draws=draws, seed=seed)
    lines = [f"ID n={id_scores.size}  OOD m={ood_scores.size}  (ID positive, higher score = ID)"]
    for name, value in values.items():
        if name in boot:
            lo, hi = confidence_interval(boot[name][0])
            lines.append(f"  {name:<16} {100 * value:6.2f}%   95% CI [{100 * lo:6.2f}, {100 * hi:6.2f}]")
        else:
            lines.append(f"  {name:<16} {100 * value:6.2f}%")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    print(format_metrics(load_scores(args.id_scores), load_scores(args.ood_scores), args.draws, args.seed))
    return 0
