"""``oodeval extract --model M --dataset D --store DIR``: one cached forward pass into a FeatureSet."""

from __future__ import annotations

import argparse

from ..features import FeatureSet
from ..features.names import parse_model_name
from ..features.pass_options import KINDS, parse_pass
from ._options import add_device, add_full_image_hash, add_model, add_progress, check_weights, json_object, with_pretrained

HELP = "extract features, logits and head of a model (timm, open_clip or your own code) on a dataset into the feature store"
EXAMPLES = [
    "oodeval extract --model resnet50 --pretrained --dataset imagenet1k-val --store feats/",
    "oodeval extract --model open_clip:ViT-B-16 --pretrained openai --dataset ninco --store feats/ --patch-features",
    "oodeval extract --model resnet50 --pretrained --dataset ninco --store feats/ --odin T=1000,eps=0.0014 --rankfeat",
    "PYTHONPATH=. oodeval extract --model my_models:cifar_resnet18 --weights ckpt.safetensors --dataset data/cifar10/test --store feats/",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model(p)
    p.add_argument("--dataset", required=True, help="registry name, NAME:SPLIT, image folder or CSV manifest")
    p.add_argument("--store", required=True, help="feature store folder")
    p.add_argument("--head", default=None, help="linear probe head (.safetensors from `oodeval probe`) to use for logits")
    p.add_argument("--model-kwargs", default=None, type=json_object, help='JSON for timm.create_model, e.g. \'{"num_classes": 10}\'')
    p.add_argument("--data-root", default=None, help="data root for registry names (default: $OODEVAL_DATA)")
    p.add_argument("--taps", action="store_true", help="also record NAC per-layer states (extras nac/<layer>)")
    p.add_argument("--nac-layers", default=None, help="comma-separated layers for --taps (default: taps.default_nac_layers)")
    p.add_argument("--nac-fit", type=int, default=None, metavar="N",
                   help="ID train: tap only the N class-balanced rows NAC fits on (its n_fit; implies --taps)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="seed of the --nac-fit rows (NAC's seed; default 0)")
    for kind, what in (("odin", "ODIN's perturbed logits: T=1000,eps=0.0014 (default), std=R,G,B"),
                       ("mds", "Mahalanobis layer features: noise=0 on ID train; noise=0.0014,fit=ID_TRAIN_FEATURESET on scored sets; layers=a+b"),
                       ("gram", "Gram matrix rows: powers=10 (default), layers=a+b"),
                       ("rankfeat", "logits with the rank-1 part of blocks removed: blocks=layer3+layer4 (default: the last two stages)"),
                       ("mcd", "Monte-Carlo dropout: samples=5,p=0.5,where=head|model,seed=0 (default)"),
                       ("adascale", "AdaSCALE's features of a slightly perturbed input: o=0.05,step=0.5 (default)"),
                       ("iodin", "i-ODIN's logits, the top-gradient value perturbed: T=1000,eps=0.0014 (default), std=R,G,B")):
        p.add_argument(f"--{kind}", nargs="?", const=True, default=None, metavar="K=V,...",
                       help=f"also run the {kind} network pass ({what}; see docs/detectors.md)")
    p.add_argument("--patch-features", action="store_true", help="VLMs (open_clip:, hf:): value-path patch features for GL-MCM")
    p.add_argument("--batch-size", type=int, default=64, help="images per forward pass (default 64)")
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes (default 0)")
    add_device(p)
    p.add_argument("--amp", default=None, action=argparse.BooleanOptionalAction, help="bf16 autocast (default: on CUDA only)")
    p.add_argument("--shard-size", type=int, default=1024, help="rows per atomically written shard (default 1024)")
    p.add_argument("--no-strict", action="store_true", help="accept a registry dataset whose image count differs")
    p.add_argument("--skip-missing", action="store_true", help="skip manifest rows whose file does not exist (default: an error)")
    add_full_image_hash(p)
    add_progress(p)


def run(args: argparse.Namespace) -> int:
    from ..features.extract import extract, extract_nac_fit

    parse_model_name(args.model)  # a misspelt name first, then the weights choice
    check_weights(args)
    model, pretrained = with_pretrained(args.model, args.pretrained, parse_model_name(args.model)[0])
    options = dict(
        weights=args.weights, data_root=args.data_root, patch_features=args.patch_features, batch_size=args.batch_size,
        num_workers=args.workers, device=args.device, model_kwargs=args.model_kwargs, progress=not args.no_progress,
        head=args.head, pretrained=pretrained, amp=args.amp, strict=not args.no_strict, shard_size=args.shard_size,
        skip_missing=args.skip_missing, full_image_hash=args.full_image_hash,
        nac_layers=args.nac_layers.split(",") if args.nac_layers else None,
        passes=[spec for kind in KINDS if (spec := parse_pass(kind, getattr(args, kind))) is not None],
    )
    if args.nac_fit is not None:
        path = extract_nac_fit(model, args.dataset, args.store, n_fit=args.nac_fit, seed=args.seed, **options)
    else:
        path = extract(model, args.dataset, args.store, taps=args.taps, **options)
    fs = FeatureSet.load(path)
    parts = [f"{len(fs)} rows", f"features {tuple(fs.features.shape)}"]
    if fs.logits is not None:
        parts.append(f"logits {tuple(fs.logits.shape)}")
    if fs.extras:
        parts.append(f"{len(fs.extras)} extras")
    if fs.meta.get("random_init"):
        parts.append("RANDOM-INIT weights (--pretrained none)")
    if fs.meta.get("n_skipped"):
        parts.append(f"{fs.meta['n_skipped']} unreadable images skipped (listed in meta.json)")
    print(path)
    print("  " + ", ".join(parts))
    return 0
