"""``oodeval probe --train DIR --out HEAD.safetensors``: a linear head on cached features."""

from __future__ import annotations

import argparse
from pathlib import Path

from .._io import check_output
from ..features import FeatureSet
from ._options import add_out

HELP = "train a linear probe (one linear layer, cross-entropy) on cached ID-train features"
EXAMPLES = [
    "oodeval probe --train feats/train --val feats/val --epochs 20 --out head.safetensors",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--train", type=Path, required=True, help="ID-train FeatureSet folder (labels >= 0 are used)")
    add_out(p, "probe head (.safetensors)", required=True)
    p.add_argument("--val", type=Path, default=None, help="optional labelled FeatureSet to report accuracy on")
    p.add_argument("--epochs", type=int, default=20, help="passes over the training features (default 20)")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 0.001)")
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW (decoupled) weight decay (default 0)")
    p.add_argument("--batch-size", type=int, default=1024, help="feature rows per step (default 1024)")
    p.add_argument("--seed", type=int, default=0, help="seed of initialisation and batch order (default 0)")


def run(args: argparse.Namespace) -> int:
    from ..features.probe import probe_accuracy, save_probe, train_probe

    check_output(args.out, "linear head")
    train = FeatureSet.load(args.train)
    n_classes = len(train.meta["class_names"]) if train.meta.get("class_names") else None
    w, b, losses = train_probe(train, epochs=args.epochs, lr=args.lr, weight_decay=args.weight_decay,
                               batch_size=args.batch_size, seed=args.seed, num_classes=n_classes, progress=True)
    save_probe(args.out, w, b, {"train": args.train, "model": train.meta.get("model"), "epochs": args.epochs,
                                "lr": args.lr, "weight_decay": args.weight_decay, "seed": args.seed})
    print(f"wrote {args.out}: head {w.shape[0]} classes x {w.shape[1]} features; loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    print(f"  train accuracy {100 * probe_accuracy(train, w, b):.2f}%")
    if args.val is not None:
        print(f"  val accuracy {100 * probe_accuracy(FeatureSet.load(args.val), w, b):.2f}%")
    print(f"use it with: oodeval extract ... --head {args.out}")
    return 0
