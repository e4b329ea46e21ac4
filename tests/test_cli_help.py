"""One CLI: every (nested) sub-command is described, shows an example, and spells shared options one way."""

import argparse
import re

import pytest

from oodeval.cli import build_parser, main
from oodeval.commands._options import FROM_MODEL_NAME, with_pretrained


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    yield path, parser
    for action in parser._actions:  # argparse offers no public walk over sub-parsers
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, (*path, name))


COMMANDS = list(_walk(build_parser()))


def test_the_walk_reaches_nested_commands():
    paths = {p for p, _ in COMMANDS}
    assert {("cnc", "evaluate"), ("vocab", "sweep"), ("construct", "export"), ("score",)} <= paths
    assert len(paths) > 25


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=lambda p: " ".join(p) or "oodeval")
def test_every_help_has_a_description_and_an_example(path, capsys):
    with pytest.raises(SystemExit) as done:
        main([*path, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    parser = dict(COMMANDS)[path]
    assert parser.description and len(parser.description) > 20
    example = text.split("examples:\n", 1)[1]
    assert example.startswith(f"  oodeval {' '.join(path)}".rstrip()) or "PYTHONPATH=. oodeval" in example
    assert not re.search(r"\bissue\b|--quiet", text)  # no internal wording, one progress option


def test_shared_options_are_spelled_one_way():
    forms: dict[str, set] = {}
    for _, parser in COMMANDS:
        for action in parser._actions:
            for flag in set(action.option_strings) & {"--no-progress", "--device", "--pretrained"}:
                forms.setdefault(flag, set()).add((type(action).__name__, action.nargs, action.const, action.default))
    assert set(forms) == {"--no-progress", "--device", "--pretrained"}
    assert all(len(f) == 1 for f in forms.values()), forms


def test_pretrained_value_joins_the_model_name():
    assert with_pretrained("resnet50", None, "timm") == ("resnet50", False)
    assert with_pretrained("resnet50", "none", "timm") == ("resnet50", False)
    assert with_pretrained("resnet50", FROM_MODEL_NAME, "timm") == ("resnet50", True)
    assert with_pretrained("timm:resnet50", "a1_in1k", "timm") == ("timm:resnet50.a1_in1k", True)
    assert with_pretrained("open_clip:ViT-B-16", "openai", "open_clip") == ("open_clip:ViT-B-16@openai", True)
    assert with_pretrained("ViT-B-16@openai", "openai", "open_clip") == ("ViT-B-16@openai", True)
    with pytest.raises(ValueError, match="already names the weights 'openai'; --pretrained laion2b disagrees"):
        with_pretrained("ViT-B-16@openai", "laion2b", "open_clip")
    with pytest.raises(ValueError, match="only timm and open_clip"):
        with_pretrained("my_models:net", "x", "python")
    assert with_pretrained("hf:apple/aimv2-large-patch14-224-lit", FROM_MODEL_NAME, "hf") == ("hf:apple/aimv2-large-patch14-224-lit", True)


def test_pretrained_errors_name_the_fix(tmp_path, capsys):
    out = str(tmp_path / "v.json")
    assert main(["vocab", "wordnet", "--model", "ViT-B-32", "--pretrained", "--out", out]) == 2
    assert "ViT-B-32 names no weights; give --pretrained TAG or --model ARCH@TAG" in capsys.readouterr().err
    assert main(["extract", "--model", "my_models:net", "--pretrained", "x", "--dataset", "d", "--store", str(tmp_path)]) == 2
    assert "only timm and open_clip models have" in capsys.readouterr().err


def test_every_option_has_help_and_shows_its_default():
    missing, silent = [], []
    for path, parser in COMMANDS:
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction | argparse._VersionAction):
                continue
            where = f"{' '.join(path)} {'/'.join(action.option_strings) or action.dest}"
            if not action.help:
                missing.append(where)
            elif (action.option_strings and action.default not in (None, False, [], argparse.SUPPRESS)
                  and not isinstance(action, argparse._StoreTrueAction) and "default" not in action.help.lower()):  # fmt: skip
                silent.append(where)
    assert not missing and not silent, (missing, silent)
    score = dict(COMMANDS)[("score",)]
    seed = next(a for a in score._actions if "--seed" in a.option_strings)
    assert seed.help.endswith("(default 0)")


def test_list_options_take_one_syntax_in_every_command():
    parser = build_parser()
    base = ["score", "--train", "t", "--test", "v"]
    forms = (["--ood", "a=x", "b=y", "--detectors", "msp", "energy"], ["--ood", "a=x,b=y", "--detectors", "msp,energy"],
             ["--ood", "a=x", "--ood", "b=y", "--detectors", "msp", "--detectors", "energy"])  # fmt: skip
    for form in forms:
        args = parser.parse_args([*base, *form])
        assert (args.ood, args.detectors) == (["a=x", "b=y"], ["msp", "energy"])
    cnc = parser.parse_args(["cnc", "evaluate", "--checkpoint", "c", "--ood", "svhn,lsun", "--detectors", "msp", "energy"])
    assert (cnc.ood, cnc.detectors) == (["svhn", "lsun"], ["msp", "energy"])
    ev = parser.parse_args(["evaluate", "--model", "m", "--train", "t", "--test", "v", "--ood", "a", "b", "--detectors", "msp,knn"])
    assert (ev.ood, ev.detectors) == (["a", "b"], ["msp", "knn"])
    for path in (("score",), ("evaluate",), ("metrics",), ("run",), ("report",)):
        flags = {f for a in dict(COMMANDS)[path]._actions for f in a.option_strings}
        assert "--convention" in flags, path
    assert all("--format" in {f for a in dict(COMMANDS)[p]._actions for f in a.option_strings} for p in (("score",), ("evaluate",), ("metrics",), ("run",)))
