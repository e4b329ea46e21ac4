"""No writer replaces what oodeval did not create; the CLI's one error path; light ``import oodeval``.

Every writing sub-command and public save function is pointed at (a) an existing folder holding a
user's CSV and a sub-folder and (b) an existing user file: it must refuse (exit 2 / OutputPathError)
and leave every byte as it was, before doing any work. A rerun onto oodeval's own earlier output
replaces or resumes it as documented.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from oodeval import cli
from oodeval._io import LEGACY_MARKER, MARKER, OutputPathError, atomic_folder, atomic_path, claim_folder, file_marker_kind, marker_kind, write_json_atomic
from oodeval.cli import main
from oodeval.data import Manifest
from oodeval.errors import InputError, StateError, UnknownNameError
from oodeval.detectors._synthetic import synthetic_problem
from oodeval.features import FeatureSet
from oodeval.features.backbones import load_state_dict_file, save_head
from oodeval.features.probe import save_probe
from oodeval.report import save_sweep
from oodeval.results import save_results
from oodeval.zeroshot.vocabulary import Vocabulary

REFUSAL = "Choose another output path, or move or remove"


def snapshot(path: Path) -> dict[str, bytes | None]:
    """Every file (with its bytes) and folder under ``path``, or the file ``path`` itself."""
    if path.is_file():
        return {".": path.read_bytes()}
    return {p.relative_to(path).as_posix(): None if p.is_dir() else p.read_bytes() for p in sorted(path.rglob("*"))}


@pytest.fixture
def foreign(tmp_path: Path) -> tuple[Path, Path]:
    """A user's folder (a CSV and a sub-folder with a file) and a user's file."""
    folder = tmp_path / "mine"
    (folder / "sub").mkdir(parents=True)
    (folder / "results.csv").write_text("a,b\n1,2\n")
    (folder / "sub" / "notes.txt").write_text("keep me\n")
    file = tmp_path / "mine.txt"
    file.write_bytes(b"user data\n")
    return folder, file


def refused_by_cli(capsys, argv_for, targets) -> None:
    """``main(argv_for(target))`` exits 2 with the refusal and leaves ``target`` byte for byte."""
    for target in targets:
        before = snapshot(target)
        rc = main([str(a) for a in argv_for(target)])
        err = capsys.readouterr().err
        assert rc == 2, err
        assert REFUSAL in err and "Traceback" not in err, err
        assert snapshot(target) == before


def refused_by_call(fn, targets) -> None:
    for target in targets:
        before = snapshot(target)
        with pytest.raises(OutputPathError, match="never deletes anything else"):
            fn(target)
        assert snapshot(target) == before


@pytest.fixture(scope="module")
def sets(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sets")
    train, test, ood = synthetic_problem(n_classes=3, dim=8, n_train=60, n_test=30, n_ood=30, seed=0)
    for name, fs in {"train": train, "test": test, "ood": ood}.items():
        fs.save(root / name)
    return root


# ------------------------------------------------------------------ the shared helper


def test_file_outputs_get_the_umask_mode_and_replace_only_their_own(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    os.umask(umask)
    target = tmp_path / "a.json"
    write_json_atomic(target, {"v": 1}, "thing")
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask and file_marker_kind(target) == "thing"
    write_json_atomic(target, {"v": 2}, "thing")
    assert json.loads(target.read_text())["v"] == 2
    with pytest.raises(OutputPathError, match="without oodeval.s other marker"):
        write_json_atomic(target, {"v": 3}, "other")
    target.write_text('{"v": 2, "edited": "by hand"}')  # the user's now: no marker
    with pytest.raises(OutputPathError, match="is an existing file without oodeval.s thing marker"):
        with atomic_path(target, "thing"):
            pytest.fail("the body must not run")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    with pytest.raises(OutputPathError, match="symbolic link"):
        with atomic_path(link, "thing"):
            pass
    assert "edited" in target.read_text() and sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "link.json"]


def test_folder_outputs_carry_a_marker_and_replace_only_what_they_wrote(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    os.umask(umask)
    out = tmp_path / "out"
    for text in ("one", "two"):
        with atomic_folder(out, "kind-a") as tmp:
            tmp.mkdir()
            (tmp / "x.txt").write_text(text)
    assert (out / "x.txt").read_text() == "two" and marker_kind(out) == "kind-a"
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask and (out / "x.txt").stat().st_mode & 0o777 == 0o666 & ~umask
    with pytest.raises(OutputPathError, match="holds oodeval's kind-a output, not a kind-b"):
        with atomic_folder(out, "kind-b") as tmp:
            tmp.mkdir()
    (out / "user.txt").write_text("added by the user")
    with pytest.raises(OutputPathError, match=r"holds 1 file\(s\) oodeval did not write there \(e.g. user.txt\)"):
        with atomic_folder(out, "kind-a") as tmp:
            tmp.mkdir()
    with pytest.raises(RuntimeError, match="boom"):  # a failing body leaves the target and no temporary behind
        with atomic_folder(tmp_path / "new", "kind-a") as tmp:
            tmp.mkdir()
            raise RuntimeError("boom")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and (out / "user.txt").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert claim_folder(empty, "kind-c") == empty and marker_kind(empty) == "kind-c"


# ------------------------------------------------------------------ every writing command


def test_score_and_probe(sets: Path, foreign, capsys, tmp_path: Path) -> None:
    score = ["score", "--train", sets / "train", "--test", sets / "test", "--ood", f"o={sets / 'ood'}",
             "--detectors", "msp", "--no-progress", "--out"]  # fmt: skip
    refused_by_cli(capsys, lambda t: score + [t], foreign)
    own = tmp_path / "table.csv"
    assert main([str(a) for a in score + [own]]) == 0 and main([str(a) for a in score + [own]]) == 0
    assert list(pd.read_csv(own, comment="#").detector) == ["msp"]
    probe = ["probe", "--train", sets / "train", "--epochs", "1", "--out"]
    refused_by_cli(capsys, lambda t: probe + [t], foreign)
    own = tmp_path / "head.safetensors"
    assert main([str(a) for a in probe + [own]]) == 0 and main([str(a) for a in probe + [own]]) == 0


def test_every_vocab_command_refuses_before_any_work(sets: Path, foreign, capsys, tmp_path: Path) -> None:
    v1 = tmp_path / "v1.json"
    Vocabulary(["cat", "dog"], "custom").save(v1)
    manifest = tmp_path / "m.csv"
    manifest.write_text("path,label,ood_label\na.png,-1,zebra\nb.png,-1,okapi\n")
    model = ["--model", "no-such-model", "--pretrained", "none"]
    llm = ["--llm-model", "m", "--llm-cache", tmp_path / "cache", "--offline"]
    feats = ["--id-features", sets / "test", "--ood-features", sets / "ood", "--values", "1"]
    for argv in (["wordnet", *model], ["llm", *llm], ["eoe", *llm], ["union", v1], ["oracle", manifest],
                 ["sweep", "wordnet", *model, "--vocab", v1, *feats]):  # fmt: skip
        refused_by_cli(capsys, lambda t: ["vocab", *argv, "--out", t], foreign)
    assert not (tmp_path / "cache").exists()
    own = tmp_path / "u.json"
    for _ in range(2):
        assert main(["vocab", "union", str(v1), "--out", str(own)]) == 0
        assert main(["vocab", "oracle", str(manifest), "--out", str(own)]) == 0  # a vocabulary replaces a vocabulary
    assert Vocabulary.load(own).labels == ["zebra", "okapi"]


def _experiment(tmp_path: Path, sets: Path, results: Path) -> Path:
    exp = tmp_path / "exp.toml"
    exp.write_text(
        f'seeds = [0]\nbootstrap_draws = 20\nresults = "{results}"\n'
        '[datasets]\nid_train = "train"\nid_test = "test"\nood = ["far"]\n'
        f'[[models]]\nname = "synthetic"\nfeatures = {{ id_train = "{sets / "train"}", id_test = "{sets / "test"}", far = "{sets / "ood"}" }}\n'
        '[[detectors]]\nname = "msp"\n'
    )
    return exp


def test_run_and_report(sets: Path, foreign, capsys, tmp_path: Path) -> None:
    folder, file = foreign
    for target in foreign:
        before = snapshot(target)
        assert main(["run", str(_experiment(tmp_path, sets, target)), "--no-progress"]) == 2
        assert REFUSAL in capsys.readouterr().err and snapshot(target) == before
    results = tmp_path / "out" / "results.parquet"
    exp = _experiment(tmp_path, sets, results)
    assert main(["run", str(exp), "--no-progress"]) == 0
    assert main(["run", str(exp), "--no-progress"]) == 0  # resumes its own table
    assert "1 already done" in capsys.readouterr().out
    refused_by_cli(capsys, lambda t: ["report", results, "--draws", "10", "--out", t], foreign)
    report = tmp_path / "report"
    assert main(["report", str(results), "--draws", "10", "--out", str(report)]) == 0
    (report / "my-notes.txt").write_text("mine")
    assert main(["report", str(results), "--draws", "10", "--out", str(report)]) == 0  # rewrites its own files only
    assert (report / "my-notes.txt").read_text() == "mine" and (report / "report.html").is_file()


def test_cnc_demo_and_zeroshot_refuse_before_any_work(foreign, capsys, tmp_path: Path) -> None:
    earlier = tmp_path / "runs"  # a folder holding an earlier seed's run: never replaced by a new run
    (earlier / "seed0").mkdir(parents=True)
    (earlier / "seed0" / "progress.json").write_text('{"format": "oodeval.cnc.checkpoint/1"}')
    refused_by_cli(capsys, lambda t: ["cnc", "train", "--dataset", "no-such-set:train", "--out", t], [*foreign, earlier])
    refused_by_cli(capsys, lambda t: ["cnc", "evaluate", "--checkpoint", tmp_path / "nowhere", "--suite", "cnc-cifar10", "--json", t], foreign)
    refused_by_cli(capsys, lambda t: ["demo", "--quick", "--out", t, "--data-root", tmp_path / "demo-data"], foreign)
    assert not (tmp_path / "demo-data").exists()
    refused_by_cli(capsys, lambda t: ["zeroshot", "--model", "no-such-model", "--pretrained", "none", "--id-features", tmp_path / "nowhere",
                                      "--ood-features", tmp_path / "nowhere", "--out", t], foreign)  # fmt: skip


def test_construct_export_and_url_templates(foreign, capsys, tmp_path: Path) -> None:
    from oodeval.construct.synthetic import make_synthetic_dataset

    d = make_synthetic_dataset(tmp_path / "data", n_classes=3, per_class=4, unassigned=0.5, seed=0)
    work = tmp_path / "work"
    candidates = ["construct", "candidates", "--manifest", d.manifest, "--reannotation", d.reannotation]
    refused_by_cli(capsys, lambda t: candidates[:2] + [t] + candidates[2:], foreign)
    assert main([str(a) for a in candidates[:2] + [work] + candidates[2:]]) == 0
    assert main([str(a) for a in candidates[:2] + [work] + candidates[2:]]) == 0  # its own project: rewritten
    assert main(["construct", "init", str(work), "--stage1", "a", "b", "--stage3", "c"]) == 0
    for option, template, message in [("--image-url-template", "https://x/{id}", "found {id}"),
                                       ("--search-template", "g=https://x/?u={0}", "found {0}")]:  # fmt: skip
        assert main(["construct", "evidence", str(work), option, template]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
    export = ["construct", "export", work, "--allow-pending", "--out"]
    refused_by_cli(capsys, lambda t: export + [t], foreign)
    assert main([str(a) for a in export + [work / "export"]]) == 0 and main([str(a) for a in export + [work / "export"]]) == 0


# ------------------------------------------------------------------ every public save function


def test_python_save_functions(sets: Path, foreign, tmp_path: Path) -> None:
    fs = FeatureSet.load(sets / "test", mmap=False)
    w, b = np.ones((2, 3), np.float32), np.zeros(2, np.float32)
    manifest = Manifest(["a.png", "b.png"], np.array([0, 1]))
    vocab = Vocabulary(["cat"], "custom")
    savers = {
        "featureset": (fs.save, "fs"),
        "save_head": (lambda p: save_head(p, w, b), "head.safetensors"),
        "save_probe": (lambda p: save_probe(p, w, b, {"seed": 0}), "probe.safetensors"),
        "manifest": (manifest.to_csv, "m.csv"),
        "vocabulary": (vocab.save, "v.json"),
    }
    for name, (save, own_name) in savers.items():
        refused_by_call(save, foreign)
        own = tmp_path / own_name
        save(own)
        save(own)  # replaces its own earlier output
    assert FeatureSet.load(tmp_path / "fs").content_hash() == fs.content_hash()
    copied = tmp_path / "copied-fs"  # a FeatureSet folder without the marker (`cp -r src/*`): the user's
    fs.save(copied)
    (copied / MARKER).unlink()
    refused_by_call(fs.save, [copied])
    legacy = tmp_path / "legacy-fs"  # an older oodeval's: its old marker lists every file in it
    fs.save(legacy)
    names = sorted(p.relative_to(legacy).as_posix() for p in legacy.rglob("*") if p.is_file() and p.name != MARKER)
    (legacy / MARKER).unlink()
    (legacy / LEGACY_MARKER).write_text(json.dumps({"kind": "FeatureSet", "oodeval": "0.0.9", "files": names}))
    fs.save(legacy)
    assert marker_kind(legacy) == "FeatureSet" and not (legacy / LEGACY_MARKER).exists()
    (legacy / "mine.txt").write_text("x")
    refused_by_call(fs.save, [legacy])
    (legacy / "mine.txt").unlink()
    np.save(legacy / "features.npy", np.zeros((2, 2)))  # a listed file whose bytes the user replaced
    refused_by_call(fs.save, [legacy])
    table = pd.DataFrame([{"model": "m", "weights": "", "detector": "msp", "hyperparameters": "{}", "dataset": "d",
                           "split": "all", "seed": 0, "status": "ok", "fpr95": 0.5}])  # fmt: skip
    refused_by_call(lambda p: save_results(table, p), foreign)
    save_results(table, tmp_path / "r.parquet")
    save_results(table, tmp_path / "r.parquet")
    sweeps = tmp_path / "t.sweeps.parquet"  # where the sweeps of results table t.parquet go
    sweeps.write_bytes(b"a user's file")
    refused_by_call(lambda p: save_sweep(tmp_path / "t.parquet", "wordnet", "m", "d", [1, 2], [0.5, 0.4]), [sweeps])
    for _ in range(2):
        save_sweep(tmp_path / "r.parquet", "wordnet", "m", "d", [1, 2], [0.5, 0.4])


def test_cnc_checkpoints_replace_only_their_own(foreign, tmp_path: Path) -> None:
    import torch

    from oodeval.cnc.train import CnCTrainConfig, save_checkpoint

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    save = lambda p: save_checkpoint(p, model, opt, CnCTrainConfig(), {"epochs_done": 1, "history": []})  # noqa: E731
    refused_by_call(save, foreign)
    save(tmp_path / "ckpt")
    save(tmp_path / "ckpt")
    assert marker_kind(tmp_path / "ckpt") == "CnC checkpoint"


def test_failed_extraction_leaves_no_partial_folder(tmp_path: Path) -> None:
    from PIL import Image

    from oodeval.features.extract import extract

    (tmp_path / "imgs" / "a").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "imgs" / "a" / "0.png")
    store = tmp_path / "store"
    with pytest.raises(InputError, match="no_such_option"):  # a keyword timm's model does not take
        extract("resnet18", tmp_path / "imgs", store, pretrained=False, model_kwargs={"no_such_option": 1}, progress=False)
    assert not (store / ".partial").exists()


# ------------------------------------------------------------------ the CLI's one error path


def _fake_command(monkeypatch, run) -> None:
    mod = types.SimpleNamespace(HELP="test", EXAMPLES=["oodeval fake"], add_arguments=lambda p: p.add_argument("--x", default=None), run=run)
    monkeypatch.setattr(cli, "_command_modules", lambda: {"fake": mod})


def test_errors_one_line_exit_codes_and_verbose_anywhere(monkeypatch, capsys) -> None:
    def bad_input(args):
        raise InputError("the input is bad")

    _fake_command(monkeypatch, bad_input)
    assert main(["fake"]) == 2
    err = capsys.readouterr().err
    assert err == "oodeval fake: error: the input is bad\n"
    for argv in (["-v", "fake"], ["fake", "-v"], ["fake", "--x", "1", "--verbose"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "Traceback" in err and err.endswith("oodeval fake: error: the input is bad\n")

    def bug(args):
        raise TypeError("a bug")

    _fake_command(monkeypatch, bug)
    assert main(["fake"]) == 1
    assert capsys.readouterr().err == ("oodeval fake: internal error TypeError: a bug; this is a bug in oodeval, please report it; "
                                       "rerun with -v for the traceback\n")  # fmt: skip

    def interrupted(args):
        raise KeyboardInterrupt

    _fake_command(monkeypatch, interrupted)
    assert main(["fake"]) == 130 and "interrupted; completed work is kept" in capsys.readouterr().err


@pytest.mark.parametrize("exc", [ValueError("bad shapes"), KeyError("layer4"), RuntimeError("no CUDA kernel"),
                                 IndexError("index 3"), AssertionError("invariant")])  # fmt: skip
def test_an_unexpected_exception_exits_1_as_a_bug(monkeypatch, capsys, exc) -> None:
    """A built-in exception that is no OodevalError (a numpy shape error, a dict lookup) is oodeval's bug, not the user's."""

    def run(args):
        raise exc

    _fake_command(monkeypatch, run)
    assert main(["fake"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"oodeval fake: internal error {type(exc).__name__}: ") and "this is a bug in oodeval, please report it" in err
    assert err.endswith("rerun with -v for the traceback\n") and err.count("\n") == 1


@pytest.mark.parametrize("exc", [InputError("k must be >= 1"), UnknownNameError("unknown detector 'knm'; known: knn"),
                                 StateError("entry e is incomplete"), OutputPathError("out exists"),
                                 FileNotFoundError(2, "No such file or directory", "feats/train"),
                                 PermissionError(13, "Permission denied", "out.csv"), IsADirectoryError(21, "Is a directory", "x"),
                                 MemoryError("cannot allocate")])  # fmt: skip
def test_a_user_error_exits_2_in_one_line(monkeypatch, capsys, exc) -> None:
    def run(args):
        raise exc

    _fake_command(monkeypatch, run)
    assert main(["fake"]) == 2
    err = capsys.readouterr().err
    assert err == f"oodeval fake: error: {exc}\n" and "bug" not in err
    if isinstance(exc, UnknownNameError):
        assert err == "oodeval fake: error: unknown detector 'knm'; known: knn\n"  # a sentence, not KeyError's quoted repr


def test_nested_sub_commands_accept_v(tmp_path: Path, capsys) -> None:
    assert main(["vocab", "union", str(tmp_path / "missing.json"), "--out", str(tmp_path / "u.json"), "-v"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "oodeval vocab: error: vocabulary file" in err


def test_known_tracebacks_are_now_clear_errors(sets: Path, tmp_path: Path, capsys) -> None:
    argv = ["score", "--train", str(sets / "train"), "--test", str(sets / "test"), "--ood", f"o={sets / 'ood'}",
            "--detectors", "knn", "--set", "knn.kk=5", "--no-progress"]  # fmt: skip
    assert main(argv) == 2
    assert "detector 'knn' has no hyperparameter(s) kk (did you mean k?); it takes: bank_fraction, compute_dtype, device, k, seed" in capsys.readouterr().err
    bad = tmp_path / "w.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json")
    with pytest.raises(ValueError, match="is not a readable safetensors file"):
        load_state_dict_file(bad)


def test_third_party_logs_and_warnings_go_through_the_log(monkeypatch, capsys) -> None:
    def chatty(args):
        logging.getLogger().info("open_clip-style INFO line")  # open_clip logs INFO on the root logger
        logging.getLogger("oodeval.test").info("our own message")
        warnings.warn("a third-party UserWarning", UserWarning, stacklevel=1)
        return 0

    _fake_command(monkeypatch, chatty)
    assert main(["fake"]) == 0
    err = capsys.readouterr().err
    assert "our own message" in err and "UserWarning: a third-party UserWarning" in err and "open_clip-style" not in err
    assert main(["fake", "-v"]) == 0
    assert "INFO root: open_clip-style INFO line" in capsys.readouterr().err


def test_python_m_oodeval_and_lazy_submodules() -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(cli.__file__).parents[1])}
    done = subprocess.run([sys.executable, "-m", "oodeval", "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage: oodeval")
    code = ("import sys, oodeval; heavy = sorted(m for m in ('numpy', 'torch', 'pandas') if m in sys.modules); "
            "print(heavy, type(oodeval.detectors.create('msp')).__name__)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[] MSP", done.stderr


# ------------------------------------------------------------------ a name or a header is no marker


def _named_like_ours(tmp_path: Path, name: str) -> Path:
    """A user's folder holding a file named like one oodeval writes (and a note of their own)."""
    folder = tmp_path / f"user-{name.replace('.', '-')}"
    folder.mkdir()
    (folder / name).write_bytes(b"the user's own " + name.encode() + b"\n")
    (folder / "notes.txt").write_text("keep me\n")
    return folder


def test_a_file_named_like_ours_or_our_header_makes_nothing_ours(sets: Path, capsys, tmp_path: Path) -> None:
    from oodeval.construct.synthetic import make_synthetic_dataset

    results = tmp_path / "out" / "results.parquet"
    exp = _experiment(tmp_path, sets, results)
    assert main(["run", str(exp), "--no-progress"]) == 0
    report = _named_like_ours(tmp_path, "report.html")
    refused_by_cli(capsys, lambda t: ["report", results, "--draws", "10", "--out", t], [report])
    refused_by_cli(capsys, lambda t: ["run", exp, "--no-progress", "--report", t], [report])
    refused_by_call(lambda t: __import__("oodeval.report", fromlist=["write_report"]).write_report(results, t, draws=10), [report])
    refused_by_cli(capsys, lambda t: ["zeroshot", "--model", "no-such-model", "--pretrained", "none", "--id-features", sets / "test",
                                      "--ood-features", sets / "ood", "--out", t], [_named_like_ours(tmp_path, "metrics.json")])  # fmt: skip
    d = make_synthetic_dataset(tmp_path / "data", n_classes=3, per_class=4, unassigned=0.5, seed=0)
    candidates = lambda t: ["construct", "candidates", t, "--manifest", d.manifest, "--reannotation", d.reannotation]  # noqa: E731
    refused_by_cli(capsys, candidates, [_named_like_ours(tmp_path, "project.json")])
    work = tmp_path / "work"
    assert main([str(a) for a in candidates(work)]) == 0
    assert main(["construct", "init", str(work), "--stage1", "a", "b", "--stage3", "c"]) == 0
    refused_by_cli(capsys, lambda t: ["construct", "export", work, "--allow-pending", "--out", t], [_named_like_ours(tmp_path, "outcome.csv")])
    refused_by_cli(capsys, lambda t: ["demo", "--quick", "--out", t, "--data-root", tmp_path / "demo-data"],
                   [_named_like_ours(tmp_path, "experiment.toml")])  # fmt: skip
    assert not (tmp_path / "demo-data").exists()
    # a user's CSV with oodeval's header, a user's Parquet table with the results' columns
    score_csv = tmp_path / "scores.csv"
    score_csv.write_text("detector,ood,fpr95,auroc\nmine,x,0.1,0.9\n")
    refused_by_cli(capsys, lambda t: ["score", "--train", sets / "train", "--test", sets / "test", "--ood", f"o={sets / 'ood'}",
                                      "--detectors", "msp", "--no-progress", "--out", t], [score_csv])  # fmt: skip
    manifest_csv = tmp_path / "manifest.csv"
    manifest_csv.write_text("path,label\nmine.png,0\n")
    refused_by_call(Manifest(["a.png"], np.array([0])).to_csv, [manifest_csv])
    table = pd.read_parquet(results)
    user_table = tmp_path / "mine.parquet"
    table.to_parquet(user_table)
    refused_by_call(lambda t: save_results(table, t), [user_table])
    # a FeatureSet folder without its marker that holds the user's files too
    fs = FeatureSet.load(sets / "test", mmap=False)
    plain = tmp_path / "plain-fs"
    fs.save(plain)
    (plain / MARKER).unlink()
    (plain / "my-analysis.txt").write_text("mine\n")
    refused_by_call(fs.save, [plain])


# ------------------------------------------------------------------ leftovers, modes


def test_staging_left_by_a_killed_writer_is_removed_by_the_next_write(tmp_path: Path) -> None:
    out = tmp_path / "out"
    claim_folder(out, "kind-k")
    code = ("import os, signal, sys; from oodeval._io import atomic_path\n"
            "with atomic_path(sys.argv[1]) as tmp:\n    tmp.write_text('half')\n    os.kill(os.getpid(), signal.SIGKILL)\n")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(cli.__file__).parents[1])}
    done = subprocess.run([sys.executable, "-c", code, str(out / "a.txt")], env=env, timeout=120)
    assert done.returncode == -9
    left = [p for p in out.iterdir() if p.name.endswith(".tmp")]
    assert len(left) == 1 and not (out / "a.txt").exists()
    mine = Path(__import__("tempfile").mkdtemp(prefix=".b.txt.", suffix=".tmp", dir=out))  # a live writer's (this process)
    (mine / ".oodeval-staging").write_text(f"{__import__('socket').gethostname()} {os.getpid()}")
    foreign = out / ".user.tmp"  # a user's folder named like a staging one, without the stamp
    foreign.mkdir()
    with atomic_path(out / "b.txt") as tmp:
        tmp.write_text("whole")
    assert not left[0].exists() and mine.is_dir() and foreign.is_dir() and (out / "b.txt").read_text() == "whole"


def test_every_output_gets_the_umask_mode(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        save_head(tmp_path / "h.safetensors", np.ones((2, 3), np.float32), np.zeros(2, np.float32))
        with atomic_folder(tmp_path / "f", "kind-m") as tmp:
            tmp.mkdir()
            save_head(tmp / "w.safetensors", np.ones((2, 3), np.float32), np.zeros(2, np.float32))
    finally:
        os.umask(old)
    assert (tmp_path / "h.safetensors").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "f" / "w.safetensors").stat().st_mode & 0o777 == 0o640 and (tmp_path / "f").stat().st_mode & 0o777 == 0o750
    assert (tmp_path / "f" / MARKER).stat().st_mode & 0o777 == 0o640


def test_a_report_stopped_midway_leaves_no_earlier_text(sets: Path, tmp_path: Path, monkeypatch) -> None:
    import errno

    from oodeval.report import figures, write_report

    results = tmp_path / "out" / "results.parquet"
    assert main(["run", str(_experiment(tmp_path, sets, results)), "--no-progress"]) == 0
    report = tmp_path / "report"
    write_report(results, report, draws=10)
    (report / "mine.txt").write_text("mine")
    real = figures.save_figure

    def full_disk(*a, **k):
        real(*a, **k)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(figures, "save_figure", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_report(results, report, draws=10)
    assert not any((report / n).exists() for n in ("report.html", "report.md", "report.tex"))
    assert (report / "mine.txt").read_text() == "mine"
    monkeypatch.setattr(figures, "save_figure", real)
    assert write_report(results, report, draws=10)["html"].is_file()


def test_shards_of_an_entry_finished_by_a_concurrent_process_are_removed(tmp_path: Path, monkeypatch) -> None:
    import shutil

    from PIL import Image

    from oodeval.features import store as st
    from oodeval.features.extract import extract

    (tmp_path / "imgs" / "a").mkdir(parents=True)
    for i in range(4):
        Image.new("RGB", (24, 24), (i, 0, 0)).save(tmp_path / "imgs" / "a" / f"{i}.png")
    store = tmp_path / "store"
    kw = {"model_kwargs": {"num_classes": 2, "pretrained_cfg_overlay": {"input_size": [3, 24, 24]}}, "batch_size": 2,
          "shard_size": 2, "progress": False}  # fmt: skip
    entry = extract("test_resnet", tmp_path / "imgs", store, **kw)
    shutil.move(entry, tmp_path / "finished")
    real = st.write_shard

    def other_process_finishes(path, *a, **k):  # the other process assembles the entry while this one writes
        real(path, *a, **k)
        if not entry.exists():
            shutil.move(tmp_path / "finished", entry)

    monkeypatch.setattr(st, "write_shard", other_process_finishes)
    assert extract("test_resnet", tmp_path / "imgs", store, **kw) == entry
    assert not (store / ".partial").exists() and FeatureSet.load(entry).features.shape[0] == 4
