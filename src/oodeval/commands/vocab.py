"""``oodeval vocab wordnet|csp|llm|eoe|union|oracle|sweep``: build negative vocabularies and size sweeps."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..errors import InputError
from .._device import resolve_device
from .._io import check_output, write_json_atomic
from ..features import FeatureSet
from ..llm import ChatClient
from ..zeroshot.build import build_wordnet, prompt_names, read_id_names
from ..zeroshot.llm_vocab import generate_eoe, generate_siblings, siblings_vocabulary
from ..zeroshot.models import load_clip
from ..zeroshot.prompts import prompts_provenance
from ..zeroshot.sweeps import sweep_prefix, sweep_siblings
from ..zeroshot.templates import template_set
from ..zeroshot.text import TextEncoder, check_same_model
from ..zeroshot.vocabulary import Vocabulary, oracle, union
from ..zeroshot.wordnet import head_lemmas, synonyms
from ._options import add_command, add_device, add_out, add_pretrained, check_weights, with_pretrained

HELP = "build negative vocabularies (WordNet+NegMining, LLM siblings, EOE, union, oracle) and size sweeps"
EXAMPLES = [
    "oodeval vocab wordnet --model ViT-B-16@openai --pretrained --out vocab/wordnet.json",
    "oodeval vocab union vocab/wordnet.json vocab/siblings.json --out vocab/union.json",
]


def _default_cache() -> Path:
    return Path(os.environ.get("OODEVAL_CACHE", Path.home() / ".cache" / "oodeval")) / "text-embeddings"


def _add_model(p: argparse.ArgumentParser, id_names_from_features: bool = False) -> None:
    p.add_argument("--model", required=True, help="[open_clip:]<arch>[@<tag>] (the tag sets QuickGELU), a model-config .json path, "
                   "or hf:<repo or folder> (transformers, e.g. hf:apple/aimv2-large-patch14-224-lit)")
    p.add_argument("--weights", default=None, help="local checkpoint file")
    add_pretrained(p, absent="refused unless --weights; say --pretrained none for a random-init model")
    p.add_argument("--seed", type=int, default=0, help="seed of a random-init model (default 0)")
    if id_names_from_features:
        p.add_argument("--id-names", default=None, help="'imagenet1k' or a file with one ID class name per line "
                       "(default: the class names recorded with the ID features; wnids are mapped to names)")
    else:
        p.add_argument("--id-names", default="imagenet1k", help="'imagenet1k' or a file with one ID class name per line")
    p.add_argument("--templates", default="paper", choices=["paper", "openai", "name"], help="template set (default: paper, 8 of App. G)")
    p.add_argument("--cache", type=Path, default=None, help="text-embedding cache root (default $OODEVAL_CACHE/text-embeddings or ~/.cache/oodeval/text-embeddings)")
    p.add_argument("--batch-size", type=int, default=256, help="prompts per text-encoder pass (default 256)")
    p.add_argument("--no-truncate", action="store_true", help="encode prompts at full context length")
    add_device(p)


def _add_llm(p: argparse.ArgumentParser) -> None:
    p.add_argument("--id-names", default="imagenet1k", help="'imagenet1k' or a file with one ID class name per line")
    p.add_argument("--base-url", default="https://api.openai.com/v1", help="OpenAI-compatible endpoint")
    p.add_argument("--llm-model", required=True, help="chat model name")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the key")
    p.add_argument("--llm-cache", type=Path, required=True, help="folder of cached raw responses (replayed offline)")
    p.add_argument("--offline", action="store_true", help="answer only from --llm-cache")
    p.add_argument("--temperature", type=float, default=None, help="LLM sampling temperature (default: the endpoint's own)")
    p.add_argument("--prompts", type=Path, default=None, help="prompt file (TOML; default: ours; e.g. EOE's released prompts, "
                   "format in docs/zeroshot.md)")
    add_out(p, "vocabulary JSON", required=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="vocab_cmd", metavar="{wordnet,csp,llm,eoe,union,oracle,sweep}", required=True)

    p = add_command(sub, "wordnet", "WordNet head lemmas (noun + adj) mined by NegMining",
                    "oodeval vocab wordnet --model ViT-B-16@openai --pretrained --M 10000 --out vocab/wordnet.json")
    _add_model(p)
    p.add_argument("--wordnet", type=Path, default=Path("/usr/share/wordnet"), help="WNDB folder (data.noun, data.adj)")
    p.add_argument("--M", default="5000", help="labels kept (default 5000; 'all' keeps the full ranking for sweeps)")
    p.add_argument("--percentile", type=float, default=95.0, help="NegMining's eta: a label's distance is this percentile over ID classes of its cosine to them (default 95)")
    p.add_argument("--keep-id-names", action="store_true", help="do not drop lexicon entries equal to an ID name")
    add_out(p, "vocabulary JSON", required=True)

    p = add_command(sub, "csp", "CSP's conjugated semantic pool: mined WordNet nouns + mined 'adjective superclass' labels",
                    "oodeval vocab csp --model ViT-B-16@openai --pretrained --id-names imagenet1k --out vocab/csp.json")
    _add_model(p)
    p.add_argument("--wordnet", type=Path, default=Path("/usr/share/wordnet"), help="WNDB folder (data.noun, data.adj)")
    p.add_argument("--fraction", type=float, default=0.15, help="share of each part (nouns, conjugated labels) kept, least ID-like first (default 0.15)")
    p.add_argument("--percentile", type=float, default=95.0, help="a label's distance: this percentile over ID classes of its cosine to them (default 95)")
    p.add_argument("--superclass-seed", type=int, default=0, help="seed of the superclass drawn for each adjective (default 0)")
    add_out(p, "vocabulary JSON", required=True)

    p = add_command(sub, "llm", "LLM near siblings per ID class (default 20), ID names and WordNet synonyms removed",
                    "oodeval vocab llm --llm-model gpt-4o --llm-cache llm-cache --k 20 --out vocab/siblings.json")
    _add_llm(p)
    p.add_argument("--k", type=int, default=20, help="siblings requested per class")
    p.add_argument("--generations", type=int, nargs="+", default=[0], help="generation indices to merge (default 0)")
    p.add_argument("--wordnet", type=Path, default=Path("/usr/share/wordnet"), help="WNDB folder whose synonyms of ID names are removed")

    p = add_command(sub, "eoe", "EOE envisioned outlier classes (far | near | fine_grained)",
                    "oodeval vocab eoe --style near --llm-model gpt-4o --llm-cache llm-cache --out vocab/eoe-near.json")
    _add_llm(p)
    p.add_argument("--style", default="fine_grained", choices=["far", "near", "fine_grained"], help="EOE prompt style: far, near or fine_grained outliers (default fine_grained)")
    p.add_argument("--n-classes", type=int, default=500, help="far / fine_grained: classes asked for, 50 per turn (default 500)")
    p.add_argument("--per-class", type=int, default=3, help="near: names asked per ID class (default 3, as released)")
    p.add_argument("--generation", type=int, default=0, help="generation index: another index asks the LLM again, a cached one replays (default 0)")

    p = add_command(sub, "union", "union of vocabularies, first occurrence kept",
                    "oodeval vocab union vocab/wordnet.json vocab/siblings.json --out vocab/union.json")
    p.add_argument("inputs", type=Path, nargs="+", help="vocabulary JSON files, in order of precedence")
    add_out(p, "vocabulary JSON", required=True)

    p = add_command(sub, "oracle", "a benchmark's own OOD labels from a manifest column",
                    "oodeval vocab oracle ninco/manifest.csv --column ood_label --id-names imagenet1k --out vocab/oracle.json")
    p.add_argument("manifest", type=Path, help="manifest CSV of the OOD benchmark")
    p.add_argument("--column", default="ood_label", help="manifest column holding the OOD labels (default ood_label)")
    p.add_argument("--id-names", default=None, help="drop labels equal to these ID names ('imagenet1k' or file)")
    add_out(p, "vocabulary JSON", required=True)

    p = add_command(sub, "sweep", "FPR@95 vs WordNet prefix size M (wordnet) or siblings per class k (siblings)",
                    "oodeval vocab sweep wordnet --model ViT-B-16@openai --pretrained --vocab vocab/wordnet-all.json --id-features feats/id "
                    "--ood-features feats/ood --values 100 1000 10000 --out sweep.json")
    p.add_argument("kind", choices=["wordnet", "siblings"], help="wordnet: prefixes of size M of a ranked vocabulary; siblings: k siblings per ID class")
    _add_model(p, id_names_from_features=True)
    p.add_argument("--vocab", type=Path, required=True, help="ranked NegMined vocabulary (wordnet) or llm-siblings vocabulary")
    p.add_argument("--id-features", type=Path, required=True, help="FeatureSet folder of ID images")
    p.add_argument("--ood-features", type=Path, required=True, help="FeatureSet folder of OOD images")
    p.add_argument("--values", type=int, nargs="+", required=True, help="M values (wordnet) or k values (siblings)")
    p.add_argument("--scorer", default="neglabel", choices=["neglabel", "eoe", "csp", "adaneg"],
                   help="zero-shot scorer of the curve (default neglabel; adaneg streams ID + OOD in order 0)")
    p.add_argument("--n-groups", type=int, default=100, help="NegLabel / CSP groups (default 100)")
    p.add_argument("--sample-seed", type=int, default=0, help="seed of the per-class sibling order")
    add_out(p, "curve JSON")


#: option -> smallest value it accepts (every size and count of the vocab sub-commands)
_MINIMUM = {"k": 1, "n_classes": 1, "per_class": 1, "batch_size": 1, "n_groups": 1, "generation": 0, "generations": 0, "values": 0}


def _check_ranges(args) -> None:
    """Refuse out-of-range sizes before any model or endpoint is touched."""
    problems = []
    m = getattr(args, "M", None)
    if m is not None and m != "all" and not (m.isdigit() and int(m) >= 1):
        problems.append(f"--M must be a whole number >= 1 or 'all', got {m!r}")
    for name, low in _MINIMUM.items():
        value = getattr(args, name, None)
        for v in value if isinstance(value, list) else [] if value is None else [value]:
            if v < low:
                problems.append(f"--{name.replace('_', '-')} must be >= {low}, got {v}")
    pct = getattr(args, "percentile", None)
    if pct is not None and not 0 <= pct <= 100:
        problems.append(f"--percentile must be in [0, 100], got {pct}")
    if problems:
        raise InputError("; ".join(problems))


def id_names_for(args, id_fs) -> list[str]:
    """``--id-names``, else the class names recorded with the ID FeatureSet (wnids mapped); never a silent default."""
    if args.id_names is not None:
        names = read_id_names(args.id_names)[0]
        print(f"ID names: {len(names)} from {args.id_names}")
        return names
    recorded = id_fs.meta.get("class_names")
    if not recorded:
        raise InputError(f"{args.id_features} records no class names: pass --id-names ('imagenet1k' or a file, one name per line)")
    names = prompt_names(recorded, f"{args.id_features} (override with --id-names)")
    print(f"ID names: {len(names)} recorded with {args.id_features}")
    return names


def encoder_for(args, *featuresets):
    """The text encoder of ``--model``, checked to be the model that made ``featuresets`` (before any encoding)."""
    enc = _encoder(args)
    check_same_model(enc.key["text_tower"], {str(getattr(fs, "meta", {}).get("dataset", i)): fs for i, fs in enumerate(featuresets)})
    return enc


def _encoder(args):
    check_weights(args)
    kind = "hf" if args.model.startswith("hf:") else "open_clip"
    model, download = with_pretrained(args.model, args.pretrained, kind)
    tag = (model if kind == "hf" else model.partition("@")[2]) if download else None  # hf: any tag = from_pretrained
    if download and not tag:
        raise InputError(f"--pretrained: {args.model} names no weights; give --pretrained TAG or --model ARCH@TAG")
    device = str(resolve_device(args.device))
    model, tokenizer, name = load_clip(model, args.weights, tag, args.seed, device)
    weights = args.weights or tag or f"random-init(seed={args.seed})"
    return TextEncoder(model, tokenizer, name, weights, template_set(args.templates), args.cache or _default_cache(),
                       args.batch_size, not args.no_truncate, device)


def _print_stats(encoder) -> None:
    s = encoder.last_stats
    if s.get("prompts"):
        print(f"text encoding: {s['prompts']} prompts in {s['seconds']:.1f}s = {s['prompts_per_s']:.0f} prompts/s "
              f"(truncation {'on' if s['truncate'] else 'off'}); {s['cached']} labels from cache")
    else:
        print(f"text encoding: all {s.get('labels', 0)} labels from cache")


def _client(args):
    return ChatClient(args.base_url, args.llm_model, api_key_env=args.api_key_env, cache_dir=args.llm_cache, offline=args.offline)


def _params(args) -> dict:
    return {} if args.temperature is None else {"temperature": args.temperature}


def run(args: argparse.Namespace) -> int:
    cmd = args.vocab_cmd
    _check_ranges(args)
    _check_out(args)
    if cmd in ("wordnet", "csp", "sweep"):
        check_weights(args)
    if cmd == "wordnet":
        m = None if args.M == "all" else int(args.M)
        names, _ = read_id_names(args.id_names)
        print(f"ID names: {len(names)} from {args.id_names}")
        print(f"WordNet lexicon: {len(head_lemmas(args.wordnet))} head lemmas of noun + adjective synsets in {args.wordnet}")
        enc = _encoder(args)
        vocab = build_wordnet(enc, names, m, args.wordnet, args.percentile, not args.keep_id_names)
        _print_stats(enc)
        vocab.save(args.out)
        print(f"wrote {len(vocab)} NegMined labels (M={args.M}) to {args.out}  hash {vocab.content_hash}")
    elif cmd == "csp":
        from ..zeroshot.csp import build_csp

        names, _ = read_id_names(args.id_names)
        print(f"ID names: {len(names)} from {args.id_names}")
        enc = _encoder(args)
        vocab = build_csp(enc, names, args.wordnet, args.fraction, args.superclass_seed, args.percentile)
        _print_stats(enc)
        vocab.save(args.out)
        prov = vocab.provenance
        print(f"wrote the CSP pool: {prov['nouns']} nouns + {prov['conjugated']} conjugated labels to {args.out}  hash {vocab.content_hash}")
    elif cmd == "llm":
        names, wnids = read_id_names(args.id_names)
        print(f"ID names: {len(names)} from {args.id_names}")
        syn = [synonyms(n, w, args.wordnet) for n, w in zip(names, wnids or [None] * len(names))]
        client = _client(args)
        merged: dict[str, list[str]] = {n: [] for n in names}
        for g in args.generations:
            for name, sibs in generate_siblings(client, names, args.k, g, syn, args.prompts, **_params(args)).items():
                merged[name] = list(dict.fromkeys(merged[name] + sibs))
        prov = {"llm_model": args.llm_model, "generations": args.generations, "requested_k": args.k,
                **prompts_provenance(args.prompts, ("siblings",))}
        vocab = siblings_vocabulary(merged, provenance=prov)
        vocab.save(args.out)
        print(f"wrote {len(vocab)} sibling labels from {len(names)} classes to {args.out}  hash {vocab.content_hash}")
    elif cmd == "eoe":
        names, _ = read_id_names(args.id_names)
        print(f"ID names: {len(names)} from {args.id_names}")
        vocab = generate_eoe(_client(args), names, args.style, args.n_classes, args.generation, per_class=args.per_class,
                             prompts=args.prompts, **_params(args))
        vocab.save(args.out)
        print(f"wrote {len(vocab)} EOE ({args.style}) labels to {args.out}  hash {vocab.content_hash}")
    elif cmd == "union":
        vocab = union([Vocabulary.load(p) for p in args.inputs])
        vocab.save(args.out)
        print(f"wrote the union of {len(args.inputs)} vocabularies: {len(vocab)} labels to {args.out}")
    elif cmd == "oracle":
        exclude = read_id_names(args.id_names)[0] if args.id_names else ()
        vocab = oracle(args.manifest, args.column, exclude)
        vocab.save(args.out)
        print(f"wrote {len(vocab)} distinct OOD labels of {args.manifest} to {args.out}")
    elif cmd == "sweep":
        return _sweep(args)
    return 0


def _out_kind(args) -> str:
    """The output kind of ``--out``: only an earlier file carrying this kind's marker is replaced."""
    return "vocabulary sweep" if args.vocab_cmd == "sweep" else "vocabulary"


def _check_out(args) -> None:
    """Refuse an ``--out`` that is neither free nor oodeval's own output of the same kind, before any work."""
    if getattr(args, "out", None) is not None:
        check_output(args.out, _out_kind(args))


def _sweep(args) -> int:
    vocab = Vocabulary.load(args.vocab)
    id_fs, ood_fs = FeatureSet.load(args.id_features), FeatureSet.load(args.ood_features)
    names = id_names_for(args, id_fs)
    enc = encoder_for(args, id_fs, ood_fs)
    id_text = enc.encode(names)
    hp = {"n_groups": args.n_groups} if args.scorer in ("neglabel", "csp") else {}
    if args.kind == "wordnet":
        negatives = enc.encode(vocab.labels[: max(args.values)])
        curve = sweep_prefix(id_fs, ood_fs, id_text, negatives, args.values, args.scorer, **hp)
    else:
        per_class = vocab.provenance.get("per_class")
        if not per_class:
            raise InputError(f"{args.vocab} has no per-class sibling lists (provenance.per_class); build it with `oodeval vocab llm`")
        curve = sweep_siblings(id_fs, ood_fs, id_text, per_class, lambda labels: enc.encode(labels, progress=False),
                               args.values, args.sample_seed, args.scorer, **hp)
    _print_stats(enc)
    curve["vocab"] = {"path": str(args.vocab), "content_hash": vocab.content_hash}
    print(f"{curve['param']:>6} {'size':>7} {'FPR@95':>8} {'AUROC':>8}")
    for x, size, fpr, auc in zip(curve["x"], curve["vocab_size"], curve["fpr95"], curve["auroc"]):
        print(f"{x:>6} {size:>7} {100 * fpr:7.2f}% {100 * auc:7.2f}%")
    if args.out:
        write_json_atomic(args.out, curve, _out_kind(args))
        print(f"wrote {args.out}")
    return 0
