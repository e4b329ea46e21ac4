"""``oodeval zeroshot``: zero-shot scorers on ID and OOD image-embedding FeatureSets, with metrics."""

from __future__ import annotations

import argparse
from pathlib import Path

from .._io import claim_folder, save_npy_atomic, write_json_atomic
from ..errors import InputError
from ..features import FeatureSet
from ..metrics import all_metrics
from ..zeroshot import REGISTRY, create_scorer, scorer_names
from ..zeroshot.testtime import Protocol, is_test_time, score_pair, spread
from ..zeroshot.vocabulary import Vocabulary
from ._options import add_out
from .vocab import _add_model, _print_stats, check_weights, encoder_for, id_names_for

HELP = "score ID/OOD image embeddings with the zero-shot VLM scorers (MCM ... NegLabel, EOE, CSP, AdaNeg) and print metrics"
EXAMPLES = [
    "oodeval zeroshot --model ViT-B-16@openai --pretrained --id-features feats/id --ood-features feats/ninco --scorers all --vocab vocab/wordnet.json",
    "oodeval zeroshot --model ViT-B-16@openai --pretrained --id-features feats/id --ood-features feats/ninco --scorers adaneg,neglabel --vocab vocab/wordnet.json --orders 5",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    _add_model(p, id_names_from_features=True)
    p.add_argument("--id-features", type=Path, required=True, help="FeatureSet folder of ID images")
    p.add_argument("--ood-features", type=Path, required=True, help="FeatureSet folder of OOD images")
    p.add_argument("--scorers", default="logit", help="comma-separated names, 'logit' (the 7 logit-space ones) or 'all'")
    p.add_argument("--vocab", type=Path, default=None, help="negative vocabulary JSON (needed by neglabel, eoe, csp, adaneg)")
    p.add_argument("--tau", type=float, default=0.01, help="softmax temperature of the similarity scores (default 0.01)")
    p.add_argument("--orders", type=int, default=1,
                   help="test-time scorers (adaneg): stream orders 0..N-1 to repeat over; prints mean, min-max and a 95%% CI (default 1)")
    p.add_argument("--id-share", type=float, default=None,
                   help="test-time scorers: fraction of ID images in the stream, the larger set subsampled (default: both sets whole)")
    p.add_argument("--stream-batch", type=int, default=None,
                   help="test-time scorers: images of the stream scored at once (default: the scorer's, 256)")
    add_out(p, "scores (<scorer>.id.npy, <scorer>.ood.npy) and metrics.json", folder=True)


def run(args: argparse.Namespace) -> int:
    check_weights(args)
    if args.out:
        claim_folder(args.out, "zero-shot scores")
    logit = scorer_names("logit")
    chosen = logit if args.scorers == "logit" else scorer_names() if args.scorers == "all" else args.scorers.split(",")
    unknown = [n for n in chosen if n not in scorer_names()]
    if unknown:
        raise InputError(f"unknown zero-shot scorers {unknown}; known: {', '.join(scorer_names())}")
    id_fs, ood_fs = FeatureSet.load(args.id_features), FeatureSet.load(args.ood_features)
    omitted = {}
    if "gl_mcm" in chosen and args.scorers in ("logit", "all") and not all("patch_features" in f.extras for f in (id_fs, ood_fs)):
        chosen = [n for n in chosen if n != "gl_mcm"]
        omitted["gl_mcm"] = "omitted: no patch_features in the FeatureSets (extract with --patch-features)"
    needs_vocab = [n for n in chosen if REGISTRY[n].uses_negatives]
    if needs_vocab and args.vocab is None:
        raise InputError(f"{', '.join(needs_vocab)} need a negative vocabulary: pass --vocab V.json")
    id_names = id_names_for(args, id_fs)
    enc = encoder_for(args, id_fs, ood_fs)
    id_text = enc.encode(id_names)
    negatives = enc.encode(Vocabulary.load(args.vocab).labels) if needs_vocab else None
    _print_stats(enc)
    if args.orders < 1:
        raise InputError(f"--orders must be >= 1, got {args.orders}")
    table: dict = {name: {"omitted": why} for name, why in omitted.items()}
    print(f"{'scorer':<10} {'FPR@95':>8} {'AUROC':>8}  stream")
    for name, why in omitted.items():
        print(f"{name:<10} {why}")
    for name in chosen:
        det = create_scorer(name, tau=args.tau)
        neg = negatives if det.uses_negatives else None
        if is_test_time(det):
            table[name] = _test_time(det, name, id_fs, ood_fs, id_text, neg, args)
            continue
        s_id, s_ood = det.score(id_fs, id_text, neg), det.score(ood_fs, id_text, neg)
        table[name] = {**all_metrics(s_id, s_ood), "test_time": False}
        print(f"{name:<10} {100 * table[name]['fpr95']:7.2f}% {100 * table[name]['auroc']:7.2f}%  static (order-free)")
        if args.out:
            for part, scores in (("id", s_id), ("ood", s_ood)):
                save_npy_atomic(args.out / f"{name}.{part}.npy", scores)
    if args.out:
        write_json_atomic(args.out / "metrics.json", table)
        print(f"wrote scores and metrics to {args.out}")
    return 0


def _test_time(det, name: str, id_fs, ood_fs, id_text, neg, args: argparse.Namespace) -> dict:
    """One test-time scorer over ``--orders`` stream orders: prints the spread, returns its record."""
    if args.stream_batch is not None:
        det.set_params(batch_size=args.stream_batch)
    runs = []
    for k in range(args.orders):
        s_id, s_ood, info = score_pair(det, id_fs, ood_fs, id_text, neg, Protocol(k, args.id_share))
        runs.append({**info, **all_metrics(s_id, s_ood)})
        if args.out:
            for part, scores in (("id", s_id), ("ood", s_ood)):
                save_npy_atomic(args.out / f"{name}.order{k}.{part}.npy", scores)
    fpr, auroc = spread([r["fpr95"] for r in runs]), spread([r["auroc"] for r in runs])
    mix = "both sets whole" if args.id_share is None else f"ID share {args.id_share:g}"
    print(f"{name:<10} {100 * fpr['mean']:7.2f}% {100 * auroc['mean']:7.2f}%  test-time: mean of {args.orders} orders "
          f"(batch {det.batch_size}, {mix}, state reset per OOD set)")
    if args.orders > 1:
        for metric, sp in (("FPR@95", fpr), ("AUROC", auroc)):
            print(f"{'':<10} {metric} min-max {100 * sp['min']:.2f}-{100 * sp['max']:.2f}%, "
                  f"95% CI of the mean [{100 * sp['ci_low']:.2f}, {100 * sp['ci_high']:.2f}]%")
    return {"fpr95": fpr["mean"], "auroc": auroc["mean"], "test_time": True, "orders": runs,
            "spread": {"fpr95": fpr, "auroc": auroc}}
