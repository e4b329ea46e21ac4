"""The ``oodeval`` command. Each sub-command is a module in :mod:`oodeval.commands` defining
``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int | None``. ``oodeval CMD ...``
imports that command's module alone and ``oodeval --help`` none (their ``HELP`` lines are read from
the source), so starting one command does not import what the others run; the heavy optional
packages (torch, matplotlib, ...) load only inside ``run``.

Each module also defines ``EXAMPLES`` (command lines shown in its ``--help``); the options
several commands share are defined once in :mod:`oodeval.commands._options`.

One error path for every command: a user error (an :class:`oodeval.errors.OodevalError`: bad
input, a refused output path; an OS error on the user's files; running out of memory) prints
``oodeval CMD: error: ...`` and exits 2; a compute cluster that cannot be reached
(:class:`oodeval.errors.ClusterUnreachableError`) exits 3; any other exception is a bug in oodeval, printed as one
line that says so, and exits 1; ``-v`` (accepted before or after the sub-command) adds the traceback.
Log records and Python warnings, oodeval's and third-party ones, go through one handler that
writes above the progress bars; third-party INFO chatter (open_clip, timm) shows only with ``-v``.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import logging
import pkgutil
import sys
import traceback

from . import __version__, commands
from ._extras import missing_extra
from .commands._options import Formatter, add_command, bound_numbers, examples
from .errors import ClusterUnreachableError, is_user_error

_VERBOSE_HELP = "log debug messages and show tracebacks (accepted anywhere on the line)"


def _command_names() -> dict[str, str]:
    """Command name -> its module's name in :mod:`oodeval.commands`, found without importing them."""
    return {info.name.replace("_", "-"): info.name for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda i: i.name)
            if not info.name.startswith("_")}  # fmt: skip


def _help_line(module: str) -> str:
    """A command module's ``HELP``, read from its source when it is a literal (the top-level
    ``--help`` then imports no command), else from the imported module."""
    spec = importlib.util.find_spec(f"{commands.__name__}.{module}")
    source = spec.loader.get_source(spec.name) if spec and spec.loader else None
    for node in ast.parse(source or "").body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["HELP"]:
            try:
                return str(ast.literal_eval(node.value))
            except ValueError:
                break
    return importlib.import_module(f"{commands.__name__}.{module}").HELP


def _command_modules() -> dict[str, object]:
    mods = {}
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{commands.__name__}.{info.name}")
        mods[getattr(mod, "NAME", info.name.replace("_", "-"))] = mod
    return mods


def _everywhere(parser: argparse.ArgumentParser) -> None:
    """Give every (nested) sub-command ``-v``, every option's help its default (:func:`_show_default`), and
    every number option its range (:func:`~oodeval.commands._options.bound_numbers`)."""
    for action in parser._actions:  # argparse offers no public walk over sub-parsers
        _show_default(action)
        bound_numbers(action)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=_VERBOSE_HELP)
                _everywhere(sub)


def _show_default(action: argparse.Action) -> None:
    """Append ``(default X)`` to an option's help that does not state its default already; flags
    (store_true), empty repeatable lists and options without a default stay as they are."""
    default = action.default
    if not action.option_strings or action.help in (None, argparse.SUPPRESS) or default in (None, False, argparse.SUPPRESS):
        return
    if isinstance(action, argparse._StoreTrueAction | argparse._VersionAction) or default == []:
        return
    if "default" not in action.help.lower():
        shown = " ".join(map(str, default)) if isinstance(default, list | tuple) else str(default)
        action.help = f"{action.help} (default {shown.replace('%', '%%')})"


def _option_names(parser: argparse.ArgumentParser) -> dict[str, str]:
    """dest -> how the command line spells it (``--label``, or the positional's metavar/dest), over every sub-command."""
    names: dict[str, str] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                names = _option_names(sub) | names
        else:
            names.setdefault(action.dest, action.option_strings[-1] if action.option_strings else str(action.metavar or action.dest))
    return names


def _check_text(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse (exit 2, naming the option) a text value that is not Unicode: bytes that are not UTF-8
    reach Python as lone surrogates, which no UTF-8 file, store or page can hold. Path options
    (``type=Path``) keep them: such file names are legal on POSIX."""
    names = _option_names(parser)
    for dest, value in vars(args).items():
        for item in value if isinstance(value, list | tuple) else [value]:
            if isinstance(item, str):
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    parser.error(f"argument {names.get(dest, dest)}: {item!a} is not UTF-8 text (a byte that is not UTF-8, "
                                 "read as a lone surrogate); give the characters themselves")


def build_parser(only: str | None = None, listing: bool = False) -> argparse.ArgumentParser:
    """The ``oodeval`` parser with every command. ``only``: import and define that command alone
    (what ``oodeval CMD ...`` parses); ``listing``: the commands by name and help line only, none
    imported (what ``oodeval --help`` shows). Importing a command imports what it runs, so this keeps
    the start of one command from importing every other."""
    parser = argparse.ArgumentParser(
        prog="oodeval", description="Evaluate out-of-distribution detection and build OOD benchmarks.", formatter_class=Formatter,
        epilog=examples("oodeval demo", "oodeval extract --model resnet50 --pretrained --dataset imagenet1k-val --store feats/",
                        "oodeval score --train feats/train --test feats/test --ood ninco=feats/ninco",
                        "oodeval run examples/experiment.toml --report report/", "oodeval COMMAND --help"),
    )  # fmt: skip
    parser.add_argument("--version", action="version", version=f"oodeval {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help=_VERBOSE_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    if listing:
        for name, module in _command_names().items():
            add_command(sub, name, _help_line(module), [])
        return parser
    mods = {only: importlib.import_module(f"{commands.__name__}.{_command_names()[only]}")} if only else _command_modules()
    for name, mod in mods.items():
        p = add_command(sub, name, mod.HELP, mod.EXAMPLES)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    _everywhere(parser)
    return parser


class _AboveBars(logging.StreamHandler):
    """Writes records with ``tqdm.write`` so that they appear above running progress bars."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)


def _route_logs(verbose: bool) -> tuple[logging.Handler, dict]:
    """Install the handler; root at WARNING (DEBUG with -v), oodeval's own loggers at INFO."""
    root, ours = logging.getLogger(), logging.getLogger("oodeval")
    before = {"root": root.level, "ours": ours.level}
    handler = _AboveBars(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.WARNING)
    ours.setLevel(logging.DEBUG if verbose else logging.INFO)
    logging.captureWarnings(True)
    return handler, before


def _unroute_logs(handler: logging.Handler, before: dict) -> None:
    logging.captureWarnings(False)
    logging.getLogger().removeHandler(handler)
    logging.getLogger().setLevel(before["root"])
    logging.getLogger("oodeval").setLevel(before["ours"])


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``oodeval`` console script (and ``python -m oodeval``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)  # the top level's options take no value
    parser = build_parser(command) if command in _command_names() else build_parser(listing=command is None)
    args = parser.parse_args(argv)
    _check_text(parser, args)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    prog = f"oodeval {args.command}"
    handler, before = _route_logs(args.verbose)
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; completed work is kept, rerun to resume", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the one place every command's errors end
        if args.verbose:
            traceback.print_exc()
        extra = missing_extra(exc)
        if extra is not None:
            print(f"{prog}: error: {extra}", file=sys.stderr)
            return 2
        msg = str(exc) or type(exc).__name__
        if isinstance(exc, ClusterUnreachableError):
            print(f"{prog}: error: {msg}", file=sys.stderr)
            return 3
        if is_user_error(exc):
            print(f"{prog}: error: {msg}", file=sys.stderr)
            return 2
        hint = "" if args.verbose else "; rerun with -v for the traceback"
        print(f"{prog}: internal error {type(exc).__name__}: {msg}; this is a bug in oodeval, please report it{hint}",
              file=sys.stderr)  # fmt: skip
        return 1
    finally:
        _unroute_logs(handler, before)


if __name__ == "__main__":
    sys.exit(main())
