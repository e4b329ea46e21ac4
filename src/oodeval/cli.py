"""The ``oodeval`` command. Each sub-command is a module in :mod:`oodeval.commands` defining
``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int | None``; modules import
their heavy dependencies inside ``run`` so that ``oodeval --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

from . import __version__, commands


def _command_modules() -> dict[str, object]:
    mods = {}
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{commands.__name__}.{info.name}")
        mods[getattr(mod, "NAME", info.name.replace("_", "-"))] = mod
    return mods


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="oodeval", description="Evaluate out-of-distribution detection and build OOD benchmarks.")
    parser.add_argument("--version", action="version", version=f"oodeval {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, mod in _command_modules().items():
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``oodeval`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        logging.getLogger("faiss").setLevel(logging.WARNING)  # its loader logs CPU-feature probing at INFO
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except (ValueError, FileNotFoundError, KeyError, RuntimeError) as exc:
        if args.verbose:
            raise
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"oodeval {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"oodeval {args.command}: interrupted; completed work is kept, rerun to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
