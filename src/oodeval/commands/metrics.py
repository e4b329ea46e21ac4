"""``oodeval metrics ID OOD``: every metric, with bootstrap 95% CIs, for two score files."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..metrics import all_metrics, aupr_columns, fpr95_columns, selective_metrics
from ..stats import bootstrap, bootstrap_selective, confidence_interval
from ._options import add_convention
from ._output import add_format, write_rows

HELP = "metrics with bootstrap CIs for ID and OOD score files (.npy, or text with one score per line)"
EXAMPLES = [
    "oodeval metrics id_scores.npy ood_scores.npy --draws 1000 --seed 0",
]


#: fewest bootstrap draws accepted: each 2.5% tail of a percentile 95% CI then holds at least 5 draws
MIN_DRAWS = 200


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("id_scores", type=Path, help="ID scores, higher = more in-distribution (- reads a text column from stdin)")
    p.add_argument("ood_scores", type=Path, help="OOD scores (- reads a text column from stdin)")
    p.add_argument("--draws", type=int, default=1000, help=f"bootstrap draws (default 1000, at least {MIN_DRAWS}; 0: no intervals)")
    p.add_argument("--resample-id", action="store_true",
                   help="resample the ID scores too (default: only the OOD scores, the ID set and its threshold fixed, paper App. C)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--id-correct", type=Path, default=None, metavar="FILE",
                   help="whether the classifier is right on each ID sample (1/0, one per ID score, .npy or text): adds AURC and AUGRC")  # fmt: skip
    add_convention(p)
    add_format(p, "the metrics")


def load_scores(path: Path) -> np.ndarray:
    """Scores from a .npy file (one 1-D numeric array), a text file with one number per line, or
    such text on stdin when ``path`` is ``-``."""
    import sys

    expected = "a .npy file holding one 1-D array of scores, or a text file with one number per line and no header"
    if str(path) == "-":
        try:
            scores = np.loadtxt(sys.stdin, dtype=np.float64, ndmin=1)
        except ValueError as exc:
            raise InputError(f"scores on stdin: {exc}; expected one number per line") from exc
        if scores.ndim != 1 or scores.size == 0:
            raise InputError(f"scores on stdin: expected one number per line, got shape {scores.shape}")
        return scores
    if not path.is_file():
        raise FileNotFoundError(f"score file {path} does not exist")
    if path.suffix == ".npy":
        try:
            scores = np.load(path, allow_pickle=False)
        except (ValueError, EOFError, OSError) as exc:
            raise InputError(f"score file {path} is not a plain .npy array ({exc}); expected {expected}") from exc
    elif path.suffix == ".npz":
        raise InputError(f"score file {path} is a .npz archive; expected {expected} (save one array with np.save)")
    else:
        try:
            scores = np.loadtxt(path, dtype=np.float64, ndmin=1)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InputError(f"score file {path}: {exc}; expected {expected}") from exc
    if scores.ndim != 1 or not (np.issubdtype(scores.dtype, np.integer) or np.issubdtype(scores.dtype, np.floating)):
        raise InputError(f"score file {path} holds a {scores.dtype} array of shape {scores.shape}; expected {expected}")
    return scores


def format_metrics(id_scores: np.ndarray, ood_scores: np.ndarray, draws: int, seed: int, resample_id: bool = False,
                   convention: str = "paper", id_correct: np.ndarray | None = None) -> str:
    """A text table of all metrics; both FPR@95s (``convention``'s first, :func:`oodeval.metrics.fpr95_columns`),
    TNR@95, AUROC and detection error with bootstrap percentile 95% CIs (OOD resampled, ID fixed;
    both with ``resample_id``), AUPR as point values; with ``id_correct`` also AURC / AUGRC (ID samples resampled)."""
    check_draws(draws)
    conventions = fpr95_columns(convention)
    values = all_metrics(id_scores, ood_scores)
    lead = [c[0] for c in conventions] + ["auroc"] + [c for c, _ in aupr_columns(convention)]
    values = {c: values[c] for c in lead} | values
    boot = bootstrap(id_scores, ood_scores, draws=draws, seed=seed, fixed_id=not resample_id) if draws else {}
    if id_correct is not None:
        values |= selective_metrics(id_scores, id_correct)
        boot |= {k: v[None] for k, v in bootstrap_selective(id_scores, id_correct, draws=draws, seed=seed).items()} if draws else {}
    which = "ID and OOD scores both resampled" if resample_id else "OOD scores resampled, ID scores and their FPR@95 threshold fixed"
    lines = [
        f"ID n={id_scores.size}  OOD m={ood_scores.size}  (higher score = ID)",
        f"95% CIs: percentile bootstrap, {draws} draws, seed {seed}; {which}" if draws else "no intervals (--draws 0)",
    ]
    for name, value in values.items():
        if not draws:
            lines.append(f"  {name:<18} {100 * value:6.2f}%")
        elif name in boot:
            lo, hi = confidence_interval(boot[name][0])
            lines.append(f"  {name:<18} {100 * value:6.2f}%   95% CI [{100 * lo:6.2f}, {100 * hi:6.2f}]")
        else:
            lines.append(f"  {name:<18} {100 * value:6.2f}%   (no interval: precision-recall areas are not bootstrapped)")
    lines += [f"{column}: {label}, {meaning}" for column, label, meaning in conventions]
    lines += ["aupr_in / aupr_out: average precision (the papers'); aupr_in_trapezoid / aupr_out_trapezoid: the trapezoid "
              "under scikit-learn's precision-recall curve (OpenOOD, pytorch-ood); autc: area under the threshold curve "
              "(pytorch-ood's, lower is better)"]
    return "\n".join(lines)


def _correct(values: np.ndarray, n: int, path: Path) -> np.ndarray:
    """The --id-correct file as booleans: one 0/1 per ID score."""
    if values.size != n or not np.isin(values, (0, 1)).all():
        raise InputError(f"--id-correct {path}: expected {n} values of 0 or 1 (one per ID score), got {values.size} "
                         f"with {int((~np.isin(values, (0, 1))).sum())} other than 0/1")  # fmt: skip
    return values.astype(bool)


def check_draws(draws: int) -> None:
    """0 (no intervals) or at least :data:`MIN_DRAWS`."""
    if draws != 0 and draws < MIN_DRAWS:
        raise InputError(f"--draws {draws} is too few for a percentile 95% interval; give at least {MIN_DRAWS}, or 0 for none")


def run(args: argparse.Namespace) -> int:
    from ..evaluation import cell_metrics, selective_cell_metrics

    if str(args.id_scores) == "-" == str(args.ood_scores):
        raise InputError("only one of the two score files can be - (stdin)")
    scores = load_scores(args.id_scores), load_scores(args.ood_scores)
    correct = None if args.id_correct is None else _correct(load_scores(args.id_correct), scores[0].size, args.id_correct)
    if args.format == "table":
        print(format_metrics(*scores, args.draws, args.seed, args.resample_id, args.convention, correct))
        return 0
    check_draws(args.draws)
    row = cell_metrics(*scores, seed=args.seed, draws=args.draws, fixed_id=not args.resample_id)
    if correct is not None:
        row |= selective_cell_metrics(scores[0], correct.astype(np.int64), seed=args.seed, draws=args.draws)
    write_rows([row], args.format)
    return 0
