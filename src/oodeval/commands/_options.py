"""The options several sub-commands share, defined once: progress, device, pretrained weights, output.

Every (nested) sub-command is made with :func:`add_command`, which gives it a description and an
example in its ``--help``; ``-v`` is added to all of them by :mod:`oodeval.cli`, and every integer and
float option gets its range from :data:`INT_RANGES` / :data:`FLOAT_RANGES` (:func:`bound_numbers`), so
a value out of range is an argparse error (exit 2) naming the option.
"""

from __future__ import annotations

import argparse
import json
import math
import textwrap
from collections.abc import Callable
from pathlib import Path

from ..errors import InputError

__all__ = ["Formatter", "add_command", "add_progress", "add_device", "add_model", "add_full_image_hash", "add_defaults", "add_pretrained", "pretrained_tag", "with_pretrained", "add_out", "examples",
           "add_convention", "check_weights", "NameList", "add_detectors",
           "int_in", "float_in", "json_object", "bound_numbers", "INT_RANGES", "FLOAT_RANGES"]

#: the ranges of the integer options (``type=int``) by their dest, enforced at parsing by :func:`bound_numbers`
INT_RANGES: dict[str, tuple[int, int | None]] = {
    "seed": (0, 2**63 - 1), "sample_seed": (0, 2**63 - 1), "draws": (0, None), "batch_size": (1, None), "shard_size": (1, None),
    "workers": (0, None), "epochs": (1, None), "top_k": (1, None), "confusions_k": (0, None), "examples": (0, None),
    "port": (0, 65535), "nac_fit": (1, None), "n": (1, None), "k": (1, None), "n_groups": (1, None), "n_classes": (1, None),
    "per_class": (1, None), "generation": (0, None), "generations": (0, None), "values": (0, None), "threads": (0, None),
    "subsample_n": (1, None), "size": (1, None), "id_class": (0, None),
    "orders": (1, None), "stream_batch": (1, None), "superclass_seed": (0, 2**63 - 1),
}
#: the ranges of the float options (``type=float``; every one is also refused when not finite): (low, high, low is open)
FLOAT_RANGES: dict[str, tuple[float, float | None, bool]] = {
    "lr": (0.0, None, True), "tau": (0.0, None, True), "weight_decay": (0.0, None, False), "alpha": (0.0, None, False),
    "temperature": (0.0, None, False), "percentile": (0.0, 100.0, False),
}

#: ``--pretrained`` given without a TAG: the weights the model name itself names
FROM_MODEL_NAME = "from-model-name"


class Formatter(argparse.HelpFormatter):
    """argparse's formatter, except that blocks with lines indented by two spaces (examples) stay
    as written. argparse's own ``RawDescriptionHelpFormatter`` would keep them too, but would also
    stop wrapping the long descriptions."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out = []
        for block in text.split("\n\n"):
            if block.startswith("  ") or "\n  " in block:
                out.append("\n".join(indent + line for line in block.splitlines()))
            else:
                out.append(textwrap.fill(" ".join(block.split()), width, initial_indent=indent, subsequent_indent=indent))
        return "\n\n".join(out)


def examples(*lines: str) -> str:
    """An epilog: ``examples:`` and one command per line."""
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def add_command(sub, name: str, help: str, example: str | list[str], description: str | None = None, **options) -> argparse.ArgumentParser:
    """A sub-command parser with a description (default: ``help``) and its example(s) in ``--help``;
    ``options`` go to ``add_parser``."""
    lines = [example] if isinstance(example, str) else list(example)
    return sub.add_parser(name, help=help, description=description or help, epilog=examples(*lines), formatter_class=Formatter, **options)


class NameList(argparse.Action):
    """A list option spelled one way everywhere: values space- or comma-separated, and the option
    repeatable (``--detectors a,b c --detectors d`` -> ``["a", "b", "c", "d"]``)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        items = list(getattr(namespace, self.dest, None) or [])
        for value in values:
            items += [v.strip() for v in value.split(",") if v.strip()]
        setattr(namespace, self.dest, items)


def add_detectors(p: argparse.ArgumentParser, default: str = "every detector the features support") -> None:
    """``--detectors NAME ...``: registry names or ``module:Class`` (:class:`NameList` syntax)."""
    p.add_argument("--detectors", nargs="+", action=NameList, default=None, metavar="NAME",
                   help="detector names, space- or comma-separated, repeatable; a class of your own as module:Class "
                   f"(default: {default})")  # fmt: skip


def add_full_image_hash(p: argparse.ArgumentParser) -> None:
    """``--full-image-hash``: key the feature cache by every byte of every image read (docs/extraction.md, Cache)."""
    p.add_argument("--full-image-hash", action="store_true",
                   help="key the feature cache by every byte of every image (default: size, mtime and three sampled 16 KiB "
                   "regions, which miss an in-place edit elsewhere that keeps size and mtime; see docs/extraction.md)")


def add_defaults(p: argparse.ArgumentParser, where: str = "") -> None:
    """``--defaults paper|openood|pytorch-ood``: the detectors' defaults profile (:mod:`oodeval.detectors.profiles`)."""
    from ..detectors.profiles import PROFILES

    p.add_argument("--defaults", choices=PROFILES, default=None,
                   help="the detectors' defaults: the paper's (default), OpenOOD v1.5's or pytorch-ood 0.4's; explicit "
                   "--set values override it, a peer's detector name (ash, KNN) picks its peer's unless set "
                   f"(docs/detectors.md, defaults profiles){where}")  # fmt: skip


def add_progress(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def add_convention(p: argparse.ArgumentParser) -> None:
    """``--convention paper|openood``: which FPR@95 leads (both are always shown)."""
    p.add_argument("--convention", choices=("paper", "openood"), default="paper",
                   help="which FPR@95 leads, the other shown beside it: paper (ID positive, OOD accepted at 95%% ID recall) "
                   "or openood (OOD positive, ID rejected at 95%% OOD recall: OpenOOD, pytorch-ood); default paper")  # fmt: skip


def add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda or cuda:N (default auto)")


def add_model(p: argparse.ArgumentParser) -> None:
    """``--model`` (any name oodeval builds a network from), ``--weights`` and ``--pretrained`` (one of
    the two is required: :func:`check_weights`)."""
    p.add_argument("--model", required=True, help="timm name (timm:NAME or NAME), open_clip:ARCH[@TAG], hf:REPO_OR_FOLDER (transformers VLM, "
                   "e.g. AIMv2), openood:NETWORK (OpenOOD's resnet18_32x32, resnet18_224x224), or package.module:factory (your code: "
                   "returns (nn.Module, transform); see docs/own-model.md)")
    p.add_argument("--weights", default=None, help="local weights file (.safetensors, or a torch checkpoint read weights_only)")
    add_pretrained(p, absent="refused unless --weights; say --pretrained none for a random-init model (seed 0)")


def int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in ``[low, high]`` (no upper bound when ``high`` is None)."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
        if number < low or (high is not None and number > high):
            raise argparse.ArgumentTypeError(f"must be an integer {f'in {low}..{high}' if high is not None else f'>= {low}'}, got {value}")
        return number

    return parse


def float_in(low: float | None = None, high: float | None = None, open_low: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in ``[low, high]`` (``(low, high]`` with ``open_low``; None: unbounded)."""

    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
        if not math.isfinite(number):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {value}")
        if low is not None and (number < low or (open_low and number == low)):
            raise argparse.ArgumentTypeError(f"must be {'>' if open_low else '>='} {low:g}, got {value}")
        if high is not None and number > high:
            raise argparse.ArgumentTypeError(f"must be <= {high:g}, got {value}")
        return number

    return parse


def json_object(value: str) -> dict:
    """An argparse type: a JSON object (``--model-kwargs '{"num_classes": 10}'``)."""
    try:
        obj = json.loads(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object of keyword arguments ({{\"name\": value}}), got {value}")
    return obj


def bound_numbers(action: argparse.Action) -> None:
    """Give an ``int`` / ``float`` option the range :data:`INT_RANGES` / :data:`FLOAT_RANGES` set for its dest
    (floats are finite in any case): a value no command can use is refused at parsing, naming the option,
    before it reaches a library (numpy, torch, a socket) that would answer with an error of its own."""
    if action.type is int and action.dest in INT_RANGES:
        action.type = int_in(*INT_RANGES[action.dest])
    elif action.type is float:
        action.type = float_in(*FLOAT_RANGES.get(action.dest, (None, None, False)))


def pretrained_tag(value: str) -> str:
    """A ``--pretrained`` TAG; a word that reads as a boolean (the experiment file's ``pretrained =
    true/false``) is refused, naming the spelling the command line uses, as no hub tag is one."""
    word = value.strip().lower()
    if word in ("false", "no", "0", "off"):
        raise argparse.ArgumentTypeError(f"{value!r} is not a hub tag: say --pretrained none for a random-init model "
                                         "(the experiment file's pretrained = false)")
    if word in ("true", "yes", "1", "on"):
        raise argparse.ArgumentTypeError(f"{value!r} is not a hub tag: give --pretrained alone for the hub weights the model "
                                         "name names (the experiment file's pretrained = true)")
    if not value.strip():
        raise argparse.ArgumentTypeError("an empty hub tag; give --pretrained alone, a TAG, or none")
    return value


def add_pretrained(p: argparse.ArgumentParser, absent: str) -> None:
    """``--pretrained [TAG]``; ``absent`` says what the command does without it."""
    p.add_argument(
        "--pretrained", nargs="?", const=FROM_MODEL_NAME, default=None, metavar="TAG", type=pretrained_tag,
        help="download weights from the hub (needs network): alone, the ones the model name names (timm's default, "
        f"open_clip's ARCH@TAG); with TAG, that pretrained tag; 'none': random init. Without it: {absent}",
    )  # fmt: skip


def check_weights(args: argparse.Namespace) -> None:
    """A model must be given weights or be declared random-init explicitly: no silent random weights."""
    if args.weights is None and args.pretrained is None:
        raise InputError(f"--model {args.model}: no weights chosen; give --weights FILE (a local checkpoint), --pretrained "
                         "(the hub weights the name names; --pretrained TAG for another tag), or --pretrained none "
                         "(random init, on purpose)")


def with_pretrained(model: str, value: str | None, kind: str) -> tuple[str, bool]:
    """``(model name carrying the hub tag, whether to download)`` for a ``--pretrained`` value.

    ``kind``: "open_clip" (a TAG joins the name as ``ARCH@TAG``) or "timm" (``NAME.TAG``); a
    name that already carries a different tag is refused. Other kinds ("hf", "python") take
    ``--pretrained`` alone or ``none`` only.
    """
    if value in (None, "none"):
        return model, False
    if value == FROM_MODEL_NAME:
        return model, True
    if kind not in ("open_clip", "timm"):
        raise InputError(f"--pretrained {value} names a hub tag, which only timm and open_clip models have; "
                         "give --pretrained alone for the weights the model name names")
    sep = "@" if kind == "open_clip" else "."
    _, tagged, tag = model.removeprefix(f"{kind}:").partition(sep)
    if tagged and tag != value:
        raise InputError(f"--model {model} already names the weights {tag!r}; --pretrained {value} disagrees")
    return (model if tagged else f"{model}{sep}{value}"), True


def add_out(p: argparse.ArgumentParser, what: str, *, folder: bool = False, required: bool = False, default: Path | None = None,
            flag: str = "--out", details: str = "") -> None:
    """The output option: a new path, or one that holds an earlier ``what`` written by oodeval; ``details`` follow once."""
    kind = "folder" if folder else "file"
    shown = f" (default {default})" if default is not None else ""
    p.add_argument(flag, type=Path, required=required, default=default, metavar="DIR" if folder else "PATH",
                   help=f"{kind} for the {what}{shown}: a new path, or one holding an earlier {what} of oodeval's; "
                   f"anything else is refused{'. ' + details if details else ''}")  # fmt: skip
