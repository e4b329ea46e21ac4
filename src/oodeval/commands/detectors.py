"""``oodeval detectors``: the registered post-hoc detectors with tags, hyperparameters and peer names."""

from __future__ import annotations

import argparse
import inspect
import json

from ..detectors import REGISTRY
from ..detectors.base import OptInDetector
from ..zeroshot.scorers import REGISTRY as SCORERS, ZS_PREFIX

HELP = "list the post-hoc detectors: tags, hyperparameters with defaults, OpenOOD / pytorch-ood names"
EXAMPLES = ["oodeval detectors", "oodeval detectors --tag openood", "oodeval detectors --tag pytorch-ood --tag feature --json"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tag", action="append", default=[], metavar="T",
                   help="only detectors carrying tag T (repeat: every tag given), e.g. paper21, openood, pytorch-ood, logit")  # fmt: skip
    p.add_argument("--json", action="store_true", help="one JSON list instead of the table")


def _defaults(cls) -> dict:
    return {p.name: p.default for p in inspect.signature(cls).parameters.values() if p.default is not inspect.Parameter.empty}


def listing(tags: list[str]) -> list[dict]:
    """One entry per detector carrying every tag in ``tags``: name, the paper's label the reports
    show (the name where its class declares none), tags, hyperparameters (name -> default), the peers' names for it (alias -> whose), whether the default selection picks it, and
    the zero-shot scorer registered under the same name (``zero_shot_namesake``: its display name
    ``zs:NAME`` and hyperparameters; None when there is none)."""
    aliases: dict[str, dict[str, str]] = {}
    for alias, (target, source) in REGISTRY.aliases().items():
        aliases.setdefault(target, {})[alias] = source
    out = []
    for name in REGISTRY.names(*tags):
        cls = REGISTRY[name]
        namesake = {"name": ZS_PREFIX + name, "hyperparameters": _defaults(SCORERS[name])} if name in SCORERS else None
        out.append({
            "name": name, "label": cls.__dict__.get("label") or name, "tags": sorted(REGISTRY.tags_of(name)),
            "hyperparameters": _defaults(cls),
            "aliases": aliases.get(name, {}), "default_selection": not issubclass(cls, OptInDetector),
            "zero_shot_namesake": namesake,
        })  # fmt: skip
    return out


def _params_text(params: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in params.items()) or "-"


def _line(entry: dict) -> str:
    hp = _params_text(entry["hyperparameters"])
    names = ", ".join(f"{a} ({s}; runs under its defaults profile)" for a, s in entry["aliases"].items())
    opt = "" if entry["default_selection"] else "  [when named]"
    twin = entry["zero_shot_namesake"]
    other = f"\n    not the zero-shot scorer {twin['name']} (oodeval zeroshot; {_params_text(twin['hyperparameters'])})" if twin else ""
    label = f" ({entry['label']} in reports)" if entry["label"] != entry["name"] else ""
    return f"{entry['name']:<24}{','.join(entry['tags'])}{opt}{label}\n    {hp}" + (f"\n    also: {names}" if names else "") + other


def run(args: argparse.Namespace) -> int:
    entries = listing(args.tag)
    if args.json:
        print(json.dumps(entries, indent=1, default=str))
    else:
        print("\n".join(_line(e) for e in entries))
        print(f"{len(entries)} detectors" + (f" tagged {' and '.join(args.tag)}" if args.tag else ""))
    return 0
