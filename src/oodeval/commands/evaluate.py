"""``oodeval evaluate``: images to the FPR@95 / AUROC table in one command.

Extracts the model on the ID-train, ID-test and every OOD set through the feature store (cached:
a rerun extracts nothing), then scores them as ``oodeval score`` does (the same rows, table and
CSV) and prints the result in ``--format``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .._io import check_output
from ..errors import InputError
from ..features import FeatureSet
from ..features.names import parse_model_name
from ..evaluation import check_request, evaluate_detectors, parse_hyperparameters, with_profiles
from ._options import (
    NameList,
    add_convention,
    add_defaults,
    add_detectors,
    add_device,
    add_full_image_hash,
    add_model,
    add_out,
    add_progress,
    check_weights,
    json_object,
    with_pretrained,
)
from ._output import add_format
from .score import parse_names, print_rows

HELP = "extract a model on ID-train, ID-test and OOD image sets (cached) and score the post-hoc detectors: one command to the table"
EXAMPLES = [
    "oodeval evaluate --model resnet50 --pretrained --train imagenet1k-train --test imagenet1k-val --ood ninco ssb_hard --detectors msp,energy,knn",
    "oodeval evaluate --model my_models:cifar_resnet18 --weights ckpt.pt --train data/train --test data/test --ood svhn=data/svhn --format json",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model(p)
    p.add_argument("--train", required=True, help="ID-train data the detectors fit on: registry name, NAME:SPLIT, image folder or CSV")
    p.add_argument("--test", required=True, help="ID-test data (same forms as --train)")
    p.add_argument("--ood", nargs="+", action=NameList, required=True, metavar="[NAME=]DATA",
                   help="OOD data sets (same forms as --train), space- or comma-separated, repeatable, each optionally "
                   "named NAME=DATA (unnamed: the registry name, or the folder / file name)")  # fmt: skip
    add_detectors(p)
    p.add_argument("--set", action="append", default=[], metavar="DETECTOR.PARAM=VALUE",
                   help="override a hyperparameter, e.g. --set knn.k=50 (repeatable)")
    add_defaults(p)
    p.add_argument("--store", type=Path, default=Path("oodeval-store"), help="feature store folder, the cache of every extraction (default oodeval-store)")
    add_out(p, "score table (CSV, as `oodeval score --out`)")
    p.add_argument("--draws", type=int, default=1000, help="bootstrap resamples for the 95%% intervals (OOD resampled, ID fixed; 0: none; default 1000)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--model-kwargs", default=None, type=json_object, help='JSON for timm.create_model, e.g. \'{"num_classes": 10}\' (default none)')
    p.add_argument("--data-root", default=None, help="data root for registry names (default: $OODEVAL_DATA)")
    p.add_argument("--batch-size", type=int, default=64, help="images per forward pass (default 64)")
    add_device(p)
    add_full_image_hash(p)
    add_convention(p)
    add_format(p, "the FPR@95 / AUROC rows")
    add_progress(p)


def name_sets(items: list[str]) -> dict[str, str]:
    """``["ninco", "far=data/x"]`` -> ``{"ninco": "ninco", "far": "data/x"}``: an unnamed set is named
    by its registry name or its folder / file name (without the suffix); names must be unique."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, data = item.partition("=")
        if not sep:
            data = item
            name = Path(item).stem if ("/" in item or Path(item).exists()) else item
        if not name or not data:
            raise InputError(f"--ood {item!r} is not of the form [NAME=]DATA")
        if name in out:
            raise InputError(f"--ood name {name!r} given twice; name the sets NAME=DATA")
        out[name] = data
    return out


def run(args: argparse.Namespace) -> int:
    from ..features.extract import extract

    parse_model_name(args.model)  # a misspelt name first, then the weights choice
    check_weights(args)
    if args.draws < 0:
        raise InputError(f"--draws must be >= 0, got {args.draws}")
    if args.out is not None:
        check_output(args.out, "score table")
    oods = name_sets(args.ood)
    names, hps = with_profiles(parse_names(args.detectors, canonical_names=False), parse_hyperparameters(args.set), args.defaults)
    check_request(names, hps)  # before any extraction
    model, pretrained = with_pretrained(args.model, args.pretrained, parse_model_name(args.model)[0])
    options = dict(weights=args.weights, pretrained=pretrained, data_root=args.data_root, batch_size=args.batch_size,
                   device=args.device, model_kwargs=args.model_kwargs, progress=not args.no_progress,
                   full_image_hash=args.full_image_hash)  # fmt: skip

    def features(data: str) -> FeatureSet:
        return FeatureSet.load(extract(model, data, args.store, **options))

    train, test = features(args.train), features(args.test)
    ood_fs = {name: features(data) for name, data in oods.items()}
    rows = evaluate_detectors(train, test, ood_fs, names, hps, progress=not args.no_progress, draws=args.draws, seed=args.seed, defaults=args.defaults)
    return print_rows(rows, args, train, None, "evaluate")
