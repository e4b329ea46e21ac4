"""``oodeval datasets``: the named benchmarks, their expected layout and count, and what the data root holds."""

from __future__ import annotations

import argparse

HELP = "list the named datasets and what is found under the data root (--data-root or $OODEVAL_DATA)"
EXAMPLES = [
    "oodeval datasets --data-root /data --layout",
    "oodeval datasets ninco",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-root", default=None, help="data root (default: $OODEVAL_DATA)")
    p.add_argument("--layout", action="store_true", help="also print each dataset's expected layout")
    p.add_argument("name", nargs="?", help="show one dataset: its layout and the manifest found")


def run(args: argparse.Namespace) -> int:
    from ..data import REGISTRY, default_data_root, resolve, status

    root = default_data_root(args.data_root)
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
