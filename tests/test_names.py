"""One meaning per public name: no public top-level function or class is defined in two of
oodeval's modules, and the post-hoc detectors and zero-shot scorers that share a registry name
(mcm, maxlogit, energy, gen, entropy) are told apart in the API, the CLI and the reports."""

import ast
import json
from collections import defaultdict
from pathlib import Path

import pandas as pd

import oodeval
from oodeval import detectors, zeroshot
from oodeval.cli import main
from oodeval.commands.run import display_rows
from oodeval.report.summary import run_summary

SHARED = {"mcm", "maxlogit", "energy", "gen", "entropy"}
#: the command protocol: every commands/NAME.py defines these
PROTOCOL = {"add_arguments", "run"}


def public_definitions() -> dict[str, list[str]]:
    root = Path(oodeval.__file__).parent
    found = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        module = path.relative_to(root).as_posix()
        skip = PROTOCOL if module.startswith("commands/") else set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if not node.name.startswith("_") and node.name not in skip:
                    found[node.name].append(module)
    return found


def test_no_public_name_is_defined_in_two_modules():
    twice = {name: modules for name, modules in public_definitions().items() if len(modules) > 1}
    assert twice == {}


def test_the_shared_registry_names_build_different_classes_with_different_names():
    assert set(detectors.names()) & set(zeroshot.scorer_names()) == SHARED
    for name in SHARED:
        post_hoc, zero_shot = type(detectors.create(name)), type(zeroshot.create_scorer(name))
        assert zero_shot.__name__ == "ZeroShot" + post_hoc.__name__, name
        assert not issubclass(zero_shot, post_hoc) and not issubclass(post_hoc, zero_shot), name
    assert detectors.create("mcm").tau == 1.0 and zeroshot.create_scorer("mcm").tau == 0.01  # the two MCMs' defaults


def test_the_detectors_command_names_each_zero_shot_namesake(capsys):
    assert main(["detectors", "--json"]) == 0
    entries = {e["name"]: e for e in json.loads(capsys.readouterr().out)}
    twins = {n: e["zero_shot_namesake"] for n, e in entries.items() if e["zero_shot_namesake"]}
    assert {n: t["name"] for n, t in twins.items()} == {n: f"zs:{n}" for n in SHARED}
    assert twins["mcm"]["hyperparameters"] == {"tau": 0.01}
    assert main(["detectors"]) == 0
    assert "not the zero-shot scorer zs:mcm (oodeval zeroshot; tau=0.01)" in capsys.readouterr().out


def result_rows() -> pd.DataFrame:
    cells = [("resnet50", "supervised", "mcm"), ("resnet50", "supervised", "energy"), ("clip", "zero-shot", "mcm"),
             ("clip", "zero-shot", "neglabel")]  # fmt: skip
    return pd.DataFrame([
        {"model": m, "kind": k, "detector": d, "label": None, "hyperparameters": "{}", "seed": 0, "status": "ok",
         "random_init": False, "dataset": "ood", "vocabulary": None}
        for m, k, d in cells
    ])  # fmt: skip


def test_the_run_table_and_the_report_summary_show_zs_where_both_kinds_share_a_name():
    shown = [r["detector"] for r in display_rows(result_rows().to_dict("records"))]
    assert shown == ["resnet50 / mcm", "resnet50 / energy", "clip / zs:mcm", "clip / neglabel"]
    lines = [line for line, _ in run_summary(result_rows(), [], [], {})]
    assert "Detectors (4): MCM (mcm), Energy (energy), zs:MCM (zs:mcm), NegLabel (neglabel)" in lines  # paper labels, ids beside them
    one_kind = result_rows().iloc[2:]  # the zero-shot rows alone: nothing to tell apart, names stay plain
    assert [r["detector"] for r in display_rows(one_kind.to_dict("records"))] == ["mcm", "neglabel"]
