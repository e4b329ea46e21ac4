"""``oodeval cnc train`` and ``oodeval cnc evaluate``: CnC outlier exposure (K+1 class).

    oodeval cnc train --dataset cifar10:train --model resnet18 --epochs 200 --out runs/cnc-s0
    oodeval cnc evaluate --checkpoint runs/cnc-s0 runs/cnc-s1 runs/cnc-s2 --suite cnc-cifar10
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .._device import resolve_device
from .._io import check_output, hash_json, write_json_atomic
from ..cnc.datasets import load_arrays, resize_arrays
from ..cnc.evaluate import aggregate, check_finished, check_id_labels, comparable, evaluate_run, format_cnc_table, outlier_class_readers
from ..cnc.suites import suite
from ..detectors import create
from ..errors import InputError
from ..results import ALL_SPLIT, compact_results, write_part
from ._options import NameList, add_command, add_detectors, add_device, add_out, add_progress

#: the baselines ``cnc evaluate`` scores by default beside the detectors that read the outlier class (the CnC paper's)
PLAIN_DETECTORS = ("msp", "energy")
HELP = "CnC: train a K+1-class model on compounded-corruption outliers; evaluate it on a suite"
EXAMPLES = [
    "oodeval cnc train --dataset cifar10:train --model resnet18 --epochs 200 --seed 0 --out runs/cnc-s0",
    "oodeval cnc evaluate --checkpoint runs/cnc-s0 runs/cnc-s1 runs/cnc-s2 --suite cnc-cifar10",
]


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="cnc_command", metavar="{train,evaluate}")
    t = add_command(sub, "train", "train (or resume) a CnC or plain model with timm",
                    "oodeval cnc train --dataset cifar10:train --model resnet18 --epochs 200 --seed 0 --out runs/cnc-s0",
                    description=_TRAIN_DOC)
    t.add_argument("--dataset", required=True, help="ID training set: registry name (NAME:SPLIT), folder, CSV or .npz")
    t.add_argument("--recipe", default=None, help="start from a named recipe: cnc-cifar (the CnC release's CIFAR "
                   "recipe: CIFAR-stem ResNet-34, 200 epochs, 64 ID + 64 outliers, crop/flip); options given override it")
    t.add_argument("--model", default=None, help="timm model name (random init; default resnet18)")
    t.add_argument("--cifar-stem", action="store_true", default=None, help="3x3 stride-1 stem, no max-pool (timm ResNets)")
    t.add_argument("--epochs", type=int, default=None, help="epochs (default 10)")
    t.add_argument("--out", type=Path, required=True, help="new run folder, or the run folder of this run to resume; any other path is refused")
    t.add_argument("--plain", action="store_true", help="train the plain K-way baseline (no outlier class)")
    t.add_argument("--alpha", type=float, default=None, help="weight of the outlier CE term (default 1)")
    t.add_argument("--batch-size", type=int, default=None, help="ID images per step; each step adds as many outliers (128)")
    t.add_argument("--lr", type=float, default=None, help="SGD learning rate (0.1; x0.1 at 50%% and 75%% of epochs)")
    t.add_argument("--weight-decay", type=float, default=None, help="default 5e-4")
    t.add_argument("--seed", type=int, default=0, help="seed of initialisation, data order and outlier synthesis (default 0)")
    t.add_argument("--classes", type=_ints, default=None, help="keep these class ids as ID, e.g. 0,1,3,5,8,9")
    t.add_argument("--corruptions", default=None,
                   help="outlier pool: release (default, the CnC release's 15), imagenet-c (the benchmark 15), all, or names")
    t.add_argument("--severity", default=None, choices=("auto", "cifar", "tinyimagenet", "imagenet", "imagecorruptions"),
                   help="corruption constants: auto = by image size (32 / 64 / larger px), or one reference's")
    add_device(t)
    _precision_arg(t)
    t.add_argument("--workers", type=int, default=0, help="DataLoader processes building the steps (0: in-process)")
    _data_args(t)
    t.add_argument("--size", type=int, default=None, help="resize images to SIZE x SIZE")
    e = add_command(sub, "evaluate", "TNR@TPR95, AUROC, detection error, ID accuracy; mean ± std over checkpoints",
                    "oodeval cnc evaluate --checkpoint runs/cnc-s0 runs/cnc-s1 runs/cnc-s2 --suite cnc-cifar10 --json cnc.json",
                    description=_EVALUATE_DOC)
    e.add_argument("--checkpoint", type=Path, nargs="+", required=True, help="checkpoint folders (one per seed)")
    e.add_argument("--suite", default=None, help="named suite (cnc-cifar10, openood-cifar10, demo-fmnist, ...)")
    e.add_argument("--id-test", default=None, help="ID test set (overrides the suite's)")
    e.add_argument("--id-train", default=None, help="ID train set, for detectors that fit (overrides the suite's)")
    e.add_argument("--ood", nargs="+", action=NameList, default=None, help="OOD sets, space- or comma-separated, repeatable (override the suite's)")
    add_detectors(e, "cnc msp energy for a CnC model, msp energy for a plain one")
    e.add_argument("--no-per-set", action="store_true", help="print only group and mean rows")
    add_out(e, "CnC evaluation JSON (runs and aggregate)", flag="--json")
    add_out(e, "results table (.parquet, the format of `oodeval run`: one row per checkpoint, detector and OOD "
            "set with 95%% bootstrap intervals; `oodeval report` shows it in its CnC summary)", flag="--results")
    e.add_argument("--draws", type=int, default=1000,
                   help="bootstrap resamples for the intervals in --results (OOD resampled, ID fixed; seeded by each run's seed)")
    e.add_argument("--resize", action="store_true",
                   help="resize sets whose image size differs from the training size (default: refuse them)")
    e.add_argument("--allow-unfinished", action="store_true",
                   help="evaluate checkpoints that stopped before their configured epochs (default: refused); "
                   "the table, JSON and results rows mark them")
    add_device(e)
    _precision_arg(e)
    _data_args(e)
    p.set_defaults(_cnc_help=p.format_help)


_TRAIN_DOC = (
    "Train a timm model with K+1 outputs: CE(ID) + alpha CE(CnC outliers -> class K) "
    "(Hebbalaguppe et al. 2022). A checkpoint (safetensors + JSON) is written after every epoch; "
    "rerunning the same command resumes."
)
_EVALUATE_DOC = (
    "Score each checkpoint's ID test set and OOD sets with the detectors (cnc reads the outlier class, every other "
    "detector the first K logits) and print TNR@TPR95, AUROC, detection error and ID accuracy per OOD set, per group "
    "and as the mean over sets, each as mean ± std over the checkpoints (one per seed; std with ddof=1). Only like "
    "runs are averaged: checkpoints that differ in more than the seed (data, device, precision, epochs reached) are "
    "refused, and so is an unfinished checkpoint unless --allow-unfinished."
)


def _precision_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16", "fp16"),
                   help="autocast dtype of the trunk: auto = bf16 on GPUs with native bf16, else fp16 (with a "
                   "gradient scaler when training), fp32 on CPU; recorded, and runs of different ones are not mixed")


def _data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-root", default=None, help="data root (default $OODEVAL_DATA)")
    p.add_argument("--channels", type=int, choices=(1, 3), default=None,
                   help="convert images to 1 grey / 3 RGB (default: as stored)")
    p.add_argument("--no-strict", action="store_true", help="accept registry datasets with unexpected counts")
    add_progress(p)


def _select(images, labels, class_ids):
    """Keep the samples of ``class_ids`` and relabel them 0..len-1 (in that order)."""
    import numpy as np

    if class_ids is None:
        return images, labels
    remap = {c: i for i, c in enumerate(class_ids)}
    keep = np.isin(labels, list(class_ids))
    if not keep.any():
        raise InputError(f"no sample has one of the classes {list(class_ids)}")
    return images[keep], np.array([remap[int(v)] for v in labels[keep]], dtype=np.int64)


def _load(args, spec, channels=None, size=None):
    """(images, labels, info) of ``spec``; unreadable images are skipped and listed (as ``extract`` does)."""
    images, labels, info = load_arrays(
        spec, args.data_root, channels=channels or args.channels, size=size,
        strict=not args.no_strict, progress=not args.no_progress,
    )  # fmt: skip
    skipped = info.get("skipped") or []
    if skipped:
        shown = "; ".join(s["error"] for s in skipped[:5]) + (f"; ... ({len(skipped) - 5} more)" if len(skipped) > 5 else "")
        print(f"{spec}: {len(skipped)} unreadable image(s) skipped: {shown}", file=sys.stderr)
    return images, labels, info


def _load_for(args, spec: str, cfg):
    """Images of ``spec`` for a model trained with ``cfg``: channels and size must match the
    training config; a size differs only with ``--resize``, channels only with ``--channels``."""
    images, labels, info = _load(args, spec)
    chans = 1 if images.ndim == 3 else images.shape[3]
    if chans != cfg.in_chans:
        fix = (f"write the .npz with {cfg.in_chans}-channel images (--channels converts image files, not .npz arrays)"
               if info.get("format") == "npz" else f"pass --channels {cfg.in_chans} to convert them")
        raise InputError(f"{spec} has {chans}-channel images but the model was trained on {cfg.in_chans}-channel "
                         f"images; {fix}")
    size = tuple(images.shape[1:3])
    if size != tuple(cfg.image_size):
        if not args.resize:
            raise InputError(f"{spec} has {size[0]}x{size[1]} images but the model was trained on "
                             f"{cfg.image_size[0]}x{cfg.image_size[1]}; pass --resize to resize them (bilinear)")
        images = resize_arrays(images, cfg.image_size)
    return images, labels


def run(args: argparse.Namespace) -> int:
    if args.cnc_command == "train":
        return _train(args)
    if args.cnc_command == "evaluate":
        return _evaluate(args)
    print(args._cnc_help(), file=sys.stderr)
    return 2


def _train(args: argparse.Namespace) -> int:
    import numpy as np

    from ..cnc.corruptions import pool
    from ..cnc.train import CHECKPOINT_KIND, RECIPES, CnCTrainConfig, train

    check_output(args.out, CHECKPOINT_KIND, folder=True)  # before loading any data
    images, labels, info = _load(args, args.dataset, size=args.size)
    images, labels = _select(images, labels, args.classes)
    if (labels < 0).any():
        raise InputError(f"{int((labels < 0).sum())} training images of {args.dataset} have no class label (-1)")
    k = len(args.classes) if args.classes else int(labels.max()) + 1
    chans = 1 if images.ndim == 3 else images.shape[3]
    given = {
        "model": args.model, "cifar_stem": args.cifar_stem, "alpha": args.alpha, "epochs": args.epochs,
        "batch_size": args.batch_size, "lr": args.lr, "weight_decay": args.weight_decay, "severity": args.severity,
        "corruptions": pool(args.corruptions) if args.corruptions else None,
    }  # fmt: skip
    base = dict(RECIPES[args.recipe]) if args.recipe in RECIPES else {}
    if args.recipe and not base:
        raise InputError(f"unknown recipe {args.recipe!r}; known: {', '.join(RECIPES)}")
    if base and chans != len(base["mean"]):
        base["mean"], base["std"] = (sum(base["mean"]) / 3,), (sum(base["std"]) / 3,)  # grey: the channel average
    base.update({k: v for k, v in given.items() if v is not None})
    config = CnCTrainConfig(**base, num_classes=k, in_chans=chans, cnc=not args.plain, seed=args.seed, class_ids=args.classes)
    print(f"training {'CnC (K+1)' if config.cnc else 'plain'} {config.model} on {len(images)} images of "
          f"{info['name']}, K={k}, {images.shape[1]}x{images.shape[2]}x{chans}, {config.epochs} epochs -> {args.out}")
    prog = train(config, np.asarray(images), labels, args.out, progress=not args.no_progress, log=print,
                 device=args.device, workers=args.workers, precision=args.precision)  # fmt: skip
    last = prog["history"][-1] if prog["history"] else {}
    print(f"done: {prog['epochs_done']}/{config.epochs} epochs; last loss {last.get('loss', float('nan')):.4f}, "
          f"train acc {last.get('train_acc', float('nan')):.4f}; checkpoint {args.out}")
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from ..cnc.train import extract_in_memory, load_checkpoint, resolve_precision

    if args.json:
        check_output(args.json, "CnC evaluation")
    if args.results:
        if args.results.suffix != ".parquet" or args.draws < 1:
            raise InputError("--results takes a .parquet results table, with --draws at least 1 (it carries 95% intervals)")
        check_output(args.results, "results table")
    s = suite(args.suite) if args.suite else None
    id_test = args.id_test or (s.id_test if s else None)
    id_train = args.id_train or (s.id_train if s else None)
    ood = args.ood or (list(s.ood) if s else None)
    if not id_test or not ood:
        raise InputError("give --suite, or --id-test and --ood")
    # a single group holding every set would only repeat the mean row
    groups = s.groups if s and not args.ood and len(s.groups) > 1 else None
    names = [str(c) for c in args.checkpoint]
    loaded = [load_checkpoint(c) for c in args.checkpoint]
    finished = [check_finished(cfg, prog, name, args.allow_unfinished) for name, (_, cfg, prog) in zip(names, loaded)]
    epochs = [int(prog["epochs_done"]) for _, _, prog in loaded]
    cfg0 = comparable([cfg for _, cfg, _ in loaded], names, epochs)
    dev = resolve_device(args.device)
    prec = resolve_precision(dev, args.precision)
    scored_on = {"device": dev.type, "precision": prec}
    detectors = args.detectors or ([*outlier_class_readers(), *PLAIN_DETECTORS] if cfg0.cnc else list(PLAIN_DETECTORS))
    misplaced = [d for d in detectors if create(d).reads_outlier_class]
    if not cfg0.cnc and misplaced:
        raise InputError(f"the {', '.join(misplaced)} detector needs a CnC (K+1) checkpoint; these are plain models")
    needs_train = any(create(d).fit_needs for d in detectors)
    x_test, y_test = _load_for(args, id_test, cfg0)
    x_test, y_test = _select(x_test, y_test, cfg0.class_ids)
    check_id_labels(y_test, cfg0.num_classes, id_test)
    x_train = y_train = None
    if needs_train:
        if not id_train:
            raise InputError(f"detectors {detectors} need an ID train set: pass --id-train")
        x_train, y_train = _load_for(args, id_train, cfg0)
        x_train, y_train = _select(x_train, y_train, cfg0.class_ids)
        check_id_labels(y_train, cfg0.num_classes, id_train)
    ood_arrays = {name: _load_for(args, name, cfg0)[0] for name in ood}
    runs, rows = [], []
    mark = "" if all(finished) else f" UNFINISHED ({epochs[0]} of {cfg0.epochs} epochs)"
    for path, (model, cfg, _) in zip(args.checkpoint, loaded):
        kw = dict(device=str(dev), precision=prec)
        fs_test = extract_in_memory(model, x_test, cfg, y_test, meta={"dataset": id_test, "checkpoint": str(path)}, **kw)
        fs_train = extract_in_memory(model, x_train, cfg, y_train, meta={"dataset": id_train}, **kw) if needs_train else None
        fs_ood = {n: extract_in_memory(model, a, cfg, meta={"dataset": n}, **kw) for n, a in ood_arrays.items()}
        run_rows: list = []
        r = evaluate_run(fs_test, fs_ood, detectors, train=fs_train, groups=groups, rows_out=run_rows if args.results else None,
                         draws=args.draws, seed=cfg.seed)  # fmt: skip
        rows += [dict(row, weights=str(Path(path).resolve())) for row in run_rows]
        runs.append(r)
        if len(args.checkpoint) > 1:
            print(format_cnc_table(r, per_set=not args.no_per_set, title=f"== {path}{mark}"))
    result = aggregate(runs) if len(runs) > 1 else runs[0]
    title = (f"== {args.suite or 'custom'}: {len(runs)} run(s), {cfg0.model}, {'CnC' if cfg0.cnc else 'plain'}, "
             f"trained on {_trained_on(cfg0)}, scored on {dev.type} {prec}{mark}")
    print(format_cnc_table(result, per_set=not args.no_per_set, title=title))
    training = {"epochs_done": epochs[0], "finished": all(finished), "train_config": _config_key(cfg0)}
    if args.json:
        write_json_atomic(args.json, {
            "suite": args.suite, "id_test": id_test, "ood": ood, "detectors": detectors,
            "checkpoints": names, "runs": runs, "aggregate": result if len(runs) > 1 else None,
            "config": cfg0.to_json(), "resized": bool(args.resize), "scored_on": scored_on, **training,
        }, "CnC evaluation")  # fmt: skip
        print(f"wrote {args.json}")
    if args.results:
        _write_results(args.results, rows, cfg0, id_test, id_train if needs_train else None, args.draws,
                       {**training, "scored_on": f"{dev.type} {prec}"})  # fmt: skip
        print(f"wrote {args.results}; `oodeval report {args.results} --out DIR` shows it")
    return 0


def _trained_on(cfg) -> str:
    """Device and precision of training ("?" where a checkpoint of an older version did not record them)."""
    return f"{cfg.device or '?'} {cfg.precision or '?'}"


def _config_key(cfg) -> str:
    """The training configuration without the seed (what the runs of one mean ± std share), hashed."""
    return hash_json({k: v for k, v in cfg.to_json().items() if k != "seed"})


def _write_results(path: Path, rows: list[dict], cfg, id_test: str, id_train: str | None, draws: int, training: dict) -> None:
    """Add the rows of :func:`oodeval.cnc.evaluate.evaluate_run` to the results table at ``path``
    (one part, then compacted): model = the timm model with "CnC" or "plain", weights = the
    checkpoint folder, seed = the run's training seed, split "all"; ``train_config`` (the config
    without the seed, hashed), ``data_hash``, ``epochs_done``, ``finished``, ``trained_on`` and
    ``scored_on`` (device and precision) let the report average only like runs."""
    from datetime import datetime, timezone

    import pandas as pd


    table = pd.DataFrame(rows).rename(columns={"ood": "dataset"})
    table["seconds"] = table["fit_seconds"] + table["score_seconds"]
    table = table.assign(
        model=f"{cfg.model} ({'CnC' if cfg.cnc else 'plain'})", split=ALL_SPLIT, kind="supervised",
        id_test=id_test, id_train=id_train, bootstrap_draws=draws, bootstrap_fixed_id=True,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"), data_hash=cfg.data_hash,
        trained_on=_trained_on(cfg), **training,
    )  # fmt: skip
    write_part(table, path)
    compact_results(path)
