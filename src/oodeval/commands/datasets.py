"""``oodeval datasets``: the named benchmarks, their expected layout and count, and what the data root holds.

    oodeval datasets [--layout] [NAME]
    oodeval datasets convert FORMAT SOURCE [--as NAME] --data-root DIR

``convert`` turns an official download (cifar10, cifar100, svhn, tinyimagenet, odin) into the
registry's layout plus a manifest.csv (:mod:`oodeval.data.convert`).
"""

from __future__ import annotations

import argparse

from ..data import REGISTRY, default_data_root, resolve, status
from ..data.convert import FORMATS, convert
from ..errors import InputError

HELP = "list the named datasets and what is found under the data root (--data-root or $OODEVAL_DATA)"
EXAMPLES = [
    "oodeval datasets --data-root /data --layout",
    "oodeval datasets ninco",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-root", default=None, help="data root (default: $OODEVAL_DATA)")
    p.add_argument("--layout", action="store_true", help="also print each dataset's expected layout")
    p.add_argument("name", nargs="?", help="show one dataset: its layout and the manifest found; or 'convert'")
    p.add_argument("convert_args", nargs="*", metavar="FORMAT SOURCE",
                   help="with 'convert': the format (cifar10, cifar100, svhn, tinyimagenet, odin) and the download "
                   "(archive, .mat folder or extracted folder)")
    p.add_argument("--as", dest="as_name", default=None, help="with 'convert': folder name under the data root "
                   "(default: the registry name)")


def _convert(args: argparse.Namespace, root) -> int:
    if len(args.convert_args) != 2:
        raise InputError(f"usage: oodeval datasets convert FORMAT SOURCE --data-root DIR (FORMAT: {', '.join(FORMATS)})")
    if root is None:
        raise InputError("convert needs a data root: pass --data-root DIR or set OODEVAL_DATA")
    fmt, source = args.convert_args
    out = convert(fmt, source, root, name=args.as_name)

    m = resolve(out, root)
    splits = "" if m.split is None else " (" + ", ".join(f"{s} {m.split.count(s):,}" for s in sorted(set(m.split))) + ")"
    print(f"wrote {out}: {len(m):,} images{splits}, {m.num_classes} classes, manifest.csv")
    return 0


def run(args: argparse.Namespace) -> int:
    root = default_data_root(args.data_root)
    if args.name == "convert":
        return _convert(args, root)
    if args.convert_args:
        raise InputError(f"unexpected arguments {args.convert_args}; only 'convert' takes more than one")
    if args.name:
        if args.name in REGISTRY:
            print(REGISTRY[args.name].describe())
        m = resolve(args.name, root)
        splits = "" if m.split is None else "  splits: " + ", ".join(f"{s}={m.split.count(s)}" for s in sorted(set(m.split)))
        print(f"{m.name}: {len(m):,} images, {m.num_classes} classes, root {m.root}{splits}")
        return 0
    print(f"data root: {root if root is not None else '(none: pass --data-root or set OODEVAL_DATA)'}")
    print(f"{'name':<26} {'role':<5} {'expected':>9} {'found':>9}  state")
    for row in status(root):
        exp = "?" if row["expected"] is None else f"{row['expected']:,}"
        found = "-" if row["found"] is None else f"{row['found']:,}"
        print(f"{row['name']:<26} {row['role']:<5} {exp:>9} {found:>9}  {row['state']}")
        if args.layout and row["name"] in REGISTRY:
            print("    " + REGISTRY[row["name"]].layout.replace("\n", "\n    "))
    return 0
