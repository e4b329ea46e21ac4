"""No command answers a mistyped option value with "internal error": a sweep of (command, option, bad
value) through ``oodeval.cli.main`` in-process, each exit 2 with a message naming the option, before any
value reaches a library (numpy, torch, timm, a socket) that would fail with an error of its own."""

from __future__ import annotations

import argparse
import importlib.util

import numpy as np
import pytest
from test_grid_e2e import make_data

from oodeval import cli
from oodeval.testing import small_problem

BIG = str(2**70)
LONE = "a\udcff"  # what a byte that is not UTF-8 on the command line becomes (surrogateescape)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("values")
    for name, fs in zip(("train", "test", "ood"), small_problem()):
        fs.save(root / name)
    rng = np.random.default_rng(0)
    np.savetxt(root / "id.txt", rng.normal(size=50))
    np.savetxt(root / "ood.txt", rng.normal(size=50) - 1)
    make_data(root / "data")
    (root / "latin1.txt").write_bytes(b"caf\xe9 0\nb 1\n")  # Latin-1, not UTF-8
    (root / "exp.toml").write_text('seeds = [0]\n[datasets]\nid_train = "data/train"\nid_test = "data/val"\nood = ["data/gray"]\n'
                                   '[[models]]\nname = "timm:test_resnet"\npretrained = false\n')
    return root


def _cases(r):
    d = r / "data"
    score = ["score", "--train", str(r / "train"), "--test", str(r / "test"), "--ood", f"o={r / 'ood'}", "--detectors", "msp", "--no-progress"]
    metrics = ["metrics", str(r / "id.txt"), str(r / "ood.txt")]
    model = ["--model", "test_resnet", "--model-kwargs", '{"num_classes": 3}', "--device", "cpu", "--no-progress"]
    extract = ["extract", *model, "--pretrained", "none", "--dataset", str(d / "val"), "--store", str(r / "store")]
    evaluate = ["evaluate", *model, "--pretrained", "none", "--train", str(d / "train"), "--test", str(d / "val"), "--ood", str(d / "gray"),
                "--detectors", "msp", "--store", str(r / "store"), "--draws", "0"]  # fmt: skip
    probe = ["probe", "--train", str(r / "train"), "--out", str(r / "head.safetensors")]
    zeroshot = ["zeroshot", "--model", "open_clip:ViT-B-32", "--pretrained", "none", "--id-names", "cifar10", "--id-features", str(r / "test"),
                "--ood-features", str(r / "ood"), "--out", str(r / "z.csv")]  # fmt: skip
    work = str(r / "work")
    return [  # (argv, the option's name as the message must show it)
        ([*score, "--draws", "-3"], "--draws"), ([*score, "--seed", "-1"], "--seed"), ([*score, "--seed", BIG], "--seed"),
        ([*metrics, "--seed", "-1"], "--seed"), ([*metrics, "--draws", "-1"], "--draws"),
        ([*extract, "--pretrained", "false"], "--pretrained none"), ([*extract, "--pretrained", "False"], "--pretrained none"),
        ([*extract, "--pretrained", "true"], "--pretrained alone"), ([*extract, "--workers", "-1"], "--workers"),
        ([*extract, "--shard-size", "0"], "--shard-size"), ([*extract, "--batch-size", "0"], "--batch-size"),
        ([*extract, "--seed", BIG], "--seed"), ([*extract, "--nac-fit", "0"], "--nac-fit"),
        ([*extract, "--model-kwargs", "[1]"], "--model-kwargs"), ([*extract, "--model-kwargs", "{"], "--model-kwargs"),
        ([*evaluate, "--pretrained", "FALSE"], "--pretrained none"), ([*evaluate, "--batch-size", "-2"], "--batch-size"),
        ([*evaluate, "--seed", "-5"], "--seed"), ([*evaluate, "--draws", "-1"], "--draws"),
        # values that pass parsing and reach timm: checked before timm is called
        ([*extract, "--pretrained", "nosuchtag"], "pretrained tag 'nosuchtag'"),
        ([*evaluate, "--model-kwargs", '{"num_classes": 3, "nosuch": 1}'], "model_kwargs"),
        (["extract", "--model", "open_clip:nosucharch", "--pretrained", "none", "--dataset", str(d / "val"), "--store", str(r / "store")],
         "open_clip has no model 'nosucharch'"),
        ([*extract, "--dataset", str(r / "latin1.txt")], "latin1.txt is not UTF-8 text"),
        ([*zeroshot, "--id-names", str(r / "latin1.txt")], "latin1.txt is not UTF-8 text"),
        (["vocab", "llm", "--llm-model", "m", "--base-url", "notaurl", "--llm-cache", str(r / "lc"), "--out", str(r / "l.json")], "'notaurl'"),
        (["vocab", "llm", "--llm-model", "m", "--base-url", "http://[::1", "--llm-cache", str(r / "lc"), "--out", str(r / "l.json")], "[::1"),
        (["run", str(r / "exp.toml"), "--executor", "local", "--executor-option", "max_jobs=0"], "max_jobs"),
        *([(["run", str(r / "exp.toml"), "--executor", "local", "--executor-option", "timeout_min=abc"], "--executor local"),
           (["run", str(r / "exp.toml"), "--executor", "local", "--executor-option", "nosuch=1"], "--executor local")]
          if importlib.util.find_spec("submitit") else []),  # submitit checks these (without it: the missing extra, exit 2 too)
        ([*probe, "--lr", "nan"], "--lr"), ([*probe, "--lr", "0"], "--lr"), ([*probe, "--epochs", "0"], "--epochs"),
        ([*probe, "--weight-decay", "-1"], "--weight-decay"), ([*probe, "--batch-size", "0"], "--batch-size"),
        (["construct", "serve", work, "--port", "70000"], "--port"), (["construct", "serve", work, "--port", "-1"], "--port"),
        (["construct", "serve", work, "--examples", "-1"], "--examples"), (["construct", "evidence", work, "--top-k", "0"], "--top-k"),
        (["construct", "evidence", work, "--confusions-k", "-1"], "--confusions-k"),
        (["construct", "verdict", work, "img", "id", "--id-class", "-1"], "--id-class"),
        (["construct", "verdict", work, "img", "ood", "--label", LONE], "--label"),
        (["construct", "verdict", work, "img", "ambiguous", "--note", LONE], "--note"),
        (["construct", "reopen", work, "img", "--reason", LONE], "--reason"),
        (["construct", "token", "reissue", work, LONE], "name"),
        ([*zeroshot, "--pretrained", "false"], "--pretrained none"), ([*zeroshot, "--tau", "0"], "--tau"), ([*zeroshot, "--tau", "inf"], "--tau"),
        (["vocab", "wordnet", "--model", "open_clip:ViT-B-32", "--pretrained", "none", "--percentile", "150", "--out", str(r / "v.json")], "--percentile"),
        (["vocab", "llm", "--llm-model", "m", "--offline", "--k", "0", "--out", str(r / "l.json")], "--k"),
        (["vocab", "llm", "--llm-model", "m", "--offline", "--temperature", "nan", "--out", str(r / "l.json")], "--temperature"),
        (["vocab", "llm", "--llm-model", "m", "--offline", "--generations", "-1", "--out", str(r / "l.json")], "--generations"),
        (["vocab", "eoe", "--llm-model", "m", "--offline", "--n-classes", "0", "--out", str(r / "e.json")], "--n-classes"),
        (["vocab", "oracle", str(d / "fi" / "manifest.csv"), "--column", LONE, "--out", str(r / "o.json")], "--column"),
        (["vocab", "sweep", "wordnet", "--model", "open_clip:ViT-B-32", "--pretrained", "none", "--vocab", str(r / "v.json"), "--id-features",
          str(r / "test"), "--ood-features", str(r / "ood"), "--values", "-1", "--out", str(r / "s.json")], "--values"),
        (["report", str(r / "x.parquet"), "--out", str(r / "rep"), "--n", "0"], "--n"),
        (["demo", "--out", str(r / "demo"), "--epochs", "0"], "--epochs"), (["demo", "--out", str(r / "demo"), "--threads", "-1"], "--threads"),
        (["cnc", "train", "--dataset", str(d / "train"), "--model", "resnet18", "--out", str(r / "cnc"), "--lr", "nan"], "--lr"),
        (["cnc", "train", "--dataset", str(d / "train"), "--model", "resnet18", "--out", str(r / "cnc"), "--size", "0"], "--size"),
    ]


def test_every_mistyped_value_is_exit_2_naming_the_option(files, capsys):
    failures = []
    for argv, named in _cases(files):
        try:
            code = cli.main(argv)
        except SystemExit as exc:  # argparse's own errors
            code = exc.code
        err = capsys.readouterr().err
        if code != 2 or named not in err or "internal error" in err:
            failures.append((argv[:2], named, code, err.strip().splitlines()[-1:] if err.strip() else ""))
    assert not failures, failures
    assert not list((files / "store").glob("*/*/meta.json"))  # nothing was extracted on the way


def test_every_number_option_has_a_range():
    """Each ``type=int`` option gets its range from ``INT_RANGES`` (a new one without a range fails here),
    unless it takes fixed choices; each ``type=float`` option is at least finite."""
    unranged = []

    def walk(parser, prefix):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*prefix, name])
            elif action.type in (int, float) and action.choices is None:
                unranged.append((" ".join(prefix), action.dest))

    walk(cli.build_parser(), [])
    assert not unranged, unranged
