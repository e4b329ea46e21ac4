"""``oodeval cnc train`` and ``oodeval cnc evaluate``: CnC outlier exposure (K+1 class).

    oodeval cnc train --dataset cifar10:train --model resnet18 --epochs 200 --out runs/cnc-s0
    oodeval cnc evaluate --checkpoint runs/cnc-s0 runs/cnc-s1 runs/cnc-s2 --suite cnc-cifar10
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "CnC: train a K+1-class model on compounded-corruption outliers; evaluate it on a suite"


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="cnc_command", metavar="{train,evaluate}")
    t = sub.add_parser("train", help="train (or resume) a CnC or plain model with timm", description=_TRAIN_DOC)
    t.add_argument("--dataset", required=True, help="ID training set: registry name (NAME:SPLIT), folder, CSV or .npz")
    t.add_argument("--model", default="resnet18", help="timm model name (random init; default resnet18)")
    t.add_argument("--epochs", type=int, default=10, help="epochs (default 10)")
    t.add_argument("--out", type=Path, required=True, help="new checkpoint folder, or an earlier checkpoint of this run to resume; any other path is refused")
    t.add_argument("--plain", action="store_true", help="train the plain K-way baseline (no outlier class)")
    t.add_argument("--alpha", type=float, default=1.0, help="weight of the outlier CE term (default 1)")
    t.add_argument("--batch-size", type=int, default=128, help="ID batch size; each gets as many outliers (128)")
    t.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (0.1; x0.1 at 50%% and 75%% of epochs)")
    t.add_argument("--weight-decay", type=float, default=5e-4)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--classes", type=_ints, default=None, help="keep these class ids as ID, e.g. 0,1,3,5,8,9")
    t.add_argument("--corruptions", default=None, help="comma-separated corruption pool (default: the 18 of issue 8, all but spatter)")
    _data_args(t)
    e = sub.add_parser("evaluate", help="TNR@TPR95, AUROC, detection error, ID accuracy; mean ± std over checkpoints")
    e.add_argument("--checkpoint", type=Path, nargs="+", required=True, help="checkpoint folders (one per seed)")
    e.add_argument("--suite", default=None, help="named suite (cnc-cifar10, openood-cifar10, demo-fmnist, ...)")
    e.add_argument("--id-test", default=None, help="ID test set (overrides the suite's)")
    e.add_argument("--id-train", default=None, help="ID train set, for detectors that fit (overrides the suite's)")
    e.add_argument("--ood", nargs="+", default=None, help="OOD sets (override the suite's)")
    e.add_argument("--detectors", nargs="+", default=None, help="default: cnc msp energy (CnC), msp energy (plain)")
    e.add_argument("--no-per-set", action="store_true", help="print only group and mean rows")
    e.add_argument("--json", type=Path, default=None, help="write runs and aggregate as JSON here (an existing file only if it is an earlier evaluation)")
    _data_args(e)
    p.set_defaults(_cnc_help=p.format_help)


_TRAIN_DOC = (
    "Train a timm model with K+1 outputs: CE(ID) + alpha CE(CnC outliers -> class K) "
    "(Hebbalaguppe et al. 2022). A checkpoint (safetensors + JSON) is written after every epoch; "
    "rerunning the same command resumes."
)


def _data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-root", default=None, help="data root (default $OODEVAL_DATA)")
    p.add_argument("--channels", type=int, choices=(1, 3), default=None, help="1 grey / 3 RGB (default: as stored)")
    p.add_argument("--size", type=int, default=None, help="resize images to SIZE x SIZE")
    p.add_argument("--no-strict", action="store_true", help="accept registry datasets with unexpected counts")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _select(images, labels, class_ids):
    """Keep the samples of ``class_ids`` and relabel them 0..len-1 (in that order)."""
    import numpy as np

    if class_ids is None:
        return images, labels
    remap = {c: i for i, c in enumerate(class_ids)}
    keep = np.isin(labels, list(class_ids))
    if not keep.any():
        raise ValueError(f"no sample has one of the classes {list(class_ids)}")
    return images[keep], np.array([remap[int(v)] for v in labels[keep]], dtype=np.int64)


def _load(args, spec, channels=None):
    from ..cnc.datasets import load_arrays

    return load_arrays(
        spec, args.data_root, channels=channels or args.channels, size=args.size,
        strict=not args.no_strict, progress=not args.no_progress,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    if args.cnc_command == "train":
        return _train(args)
    if args.cnc_command == "evaluate":
        return _evaluate(args)
    print(args._cnc_help(), file=sys.stderr)
    return 2


def _train(args: argparse.Namespace) -> int:
    import numpy as np

    from .._io import check_output
    from ..cnc.corruptions import DEFAULT_POOL
    from ..cnc.train import CHECKPOINT_KIND, TrainConfig, is_checkpoint_folder, train

    check_output(args.out, CHECKPOINT_KIND, folder=True, is_own=is_checkpoint_folder)  # before loading any data
    images, labels, info = _load(args, args.dataset)
    images, labels = _select(images, labels, args.classes)
    if (labels < 0).any():
        raise ValueError(f"{int((labels < 0).sum())} training images of {args.dataset} have no class label (-1)")
    k = len(args.classes) if args.classes else int(labels.max()) + 1
    chans = 1 if images.ndim == 3 else images.shape[3]
    config = TrainConfig(
        model=args.model, num_classes=k, in_chans=chans, cnc=not args.plain, alpha=args.alpha,
        epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, weight_decay=args.weight_decay,
        seed=args.seed, corruptions=tuple(args.corruptions.split(",")) if args.corruptions else DEFAULT_POOL,
        class_ids=args.classes,
    )  # fmt: skip
    print(f"training {'CnC (K+1)' if config.cnc else 'plain'} {args.model} on {len(images)} images of "
          f"{info['name']}, K={k}, {images.shape[1]}x{images.shape[2]}x{chans}, {args.epochs} epochs -> {args.out}")
    prog = train(config, np.asarray(images), labels, args.out, progress=not args.no_progress, log=print)
    last = prog["history"][-1] if prog["history"] else {}
    print(f"done: {prog['epochs_done']}/{config.epochs} epochs; last loss {last.get('loss', float('nan')):.4f}, "
          f"train acc {last.get('train_acc', float('nan')):.4f}; checkpoint {args.out}")
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from .._io import check_output, json_has_keys, write_json_atomic
    from ..cnc.evaluate import aggregate, evaluate_run, format_table
    from ..cnc.suites import suite
    from ..cnc.train import extract, load_checkpoint
    from ..detectors import create

    is_evaluation = json_has_keys("runs", "checkpoints", "aggregate")
    if args.json:
        check_output(args.json, "CnC evaluation", is_own=is_evaluation)
    s = suite(args.suite) if args.suite else None
    id_test = args.id_test or (s.id_test if s else None)
    id_train = args.id_train or (s.id_train if s else None)
    ood = args.ood or (list(s.ood) if s else None)
    if not id_test or not ood:
        raise ValueError("give --suite, or --id-test and --ood")
    groups = s.groups if s and not args.ood else None
    loaded = [load_checkpoint(c) for c in args.checkpoint]
    kinds = {cfg.cnc for _, cfg, _ in loaded}
    if len(kinds) > 1:
        raise ValueError("the checkpoints mix CnC and plain models; evaluate them separately")
    cfg0 = loaded[0][1]
    for path, (_, cfg, _) in zip(args.checkpoint, loaded):
        if (cfg.num_classes, cfg.in_chans, cfg.class_ids) != (cfg0.num_classes, cfg0.in_chans, cfg0.class_ids):
            raise ValueError(f"{path} has other classes or channels than {args.checkpoint[0]}")
    detectors = args.detectors or (["cnc", "msp", "energy"] if cfg0.cnc else ["msp", "energy"])
    if not cfg0.cnc and "cnc" in detectors:
        raise ValueError("the cnc detector needs a CnC (K+1) checkpoint; these are plain models")
    needs_train = any(create(d).fit_needs for d in detectors)
    chans = cfg0.in_chans
    x_test, y_test, _ = _load(args, id_test, chans)
    x_test, y_test = _select(x_test, y_test, cfg0.class_ids)
    x_train = y_train = None
    if needs_train:
        if not id_train:
            raise ValueError(f"detectors {detectors} need an ID train set: pass --id-train")
        x_train, y_train, _ = _load(args, id_train, chans)
        x_train, y_train = _select(x_train, y_train, cfg0.class_ids)
    ood_arrays = {name: _load(args, name, chans)[0] for name in ood}
    runs = []
    for path, (model, cfg, _) in zip(args.checkpoint, loaded):
        fs_test = extract(model, x_test, cfg, y_test, meta={"dataset": id_test, "checkpoint": str(path)})
        fs_train = extract(model, x_train, cfg, y_train, meta={"dataset": id_train}) if needs_train else None
        fs_ood = {n: extract(model, a, cfg, meta={"dataset": n}) for n, a in ood_arrays.items()}
        r = evaluate_run(fs_test, fs_ood, detectors, train=fs_train, groups=groups)
        runs.append(r)
        if len(args.checkpoint) > 1:
            print(format_table(r, per_set=not args.no_per_set, title=f"== {path}"))
    result = aggregate(runs) if len(runs) > 1 else runs[0]
    title = f"== {args.suite or 'custom'}: {len(runs)} run(s), {cfg0.model}, {'CnC' if cfg0.cnc else 'plain'}"
    print(format_table(result, per_set=not args.no_per_set, title=title))
    if args.json:
        write_json_atomic(args.json, {
            "suite": args.suite, "id_test": id_test, "ood": ood, "detectors": detectors,
            "checkpoints": [str(c) for c in args.checkpoint], "runs": runs, "aggregate": result if len(runs) > 1 else None,
        }, "CnC evaluation", is_evaluation)  # fmt: skip
        print(f"wrote {args.json}")
    return 0
