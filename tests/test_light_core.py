"""The core install: scoring saved FeatureSets (``oodeval score``, ``metrics``, ``oodeval.evaluate``)
imports none of the extras' packages, and a command that needs one names the extra to install.

Run in a subprocess whose import system refuses the extras' packages, as a fresh ``pip install
oodeval`` without extras would (scripts/check_core_install.sh does the real install)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from oodeval._extras import EXTRAS
from oodeval.detectors._synthetic import synthetic_problem

SRC = Path(__file__).resolve().parents[1] / "src"

BLOCKER = textwrap.dedent(f"""
    import importlib.abc, json, sys
    BLOCK = {sorted(EXTRAS)!r}
    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in BLOCK:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
    sys.meta_path.insert(0, Refuse())
    sys.path.insert(0, {str(SRC)!r})
""")


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKER + textwrap.dedent(code)], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_scoring_saved_featuresets_needs_no_extra(tmp_path):
    train, test, ood = synthetic_problem(n_classes=4, dim=8, n_train=60, n_test=30, n_ood=20, seed=5)
    for name, fs in (("train", train), ("test", test), ("ood", ood)):
        fs.save(tmp_path / name)
    done = _python("""
        from oodeval.cli import main
        import oodeval
        code = main(["score", "--train", "train", "--test", "test", "--ood", "x=ood", "--set", "knn.k=5", "--draws", "50",
                     "--no-progress", "--format", "json"])
        df = oodeval.evaluate(train="train", id="test", ood={"x": "ood"}, detectors=["msp", "vim"], draws=0)
        loaded = sorted(m.split(".")[0] for m in sys.modules if m.split(".")[0] in BLOCK)
        print(json.dumps({"code": code, "api": df["fpr95"].tolist(), "loaded": loaded}), file=sys.stderr)
    """, tmp_path)
    rows = json.loads(done.stdout)
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report["code"] == 0 and report["loaded"] == [], done.stderr
    assert len(rows) == 21 and all(r["status"] == "ok" for r in rows)  # the 21 paper detectors (cnc needs a K+1 model)
    msp = next(r for r in rows if r["detector"] == "msp")
    assert report["api"][0] == msp["fpr95"]


def test_a_command_that_needs_an_extra_names_it(tmp_path):
    done = _python("""
        from oodeval.cli import main
        import oodeval
        for argv in (["extract", "--model", "resnet18", "--pretrained", "none", "--dataset", ".", "--store", "s"],
                     ["report", "r.parquet", "--out", "rep"]):
            print(main(argv))
        try:
            oodeval.extract_features("resnet18", ".", "s")
        except ModuleNotFoundError as exc:
            print("API", exc)
    """, tmp_path)
    out, err = done.stdout.split("\n"), done.stderr
    assert out[:2] == ["2", "2"], err
    assert "oodeval extract: error: this needs torch, which the core install leaves out: pip install 'oodeval[models]'" in err
    assert "oodeval report: error: this needs matplotlib, which the core install leaves out: pip install 'oodeval[report]'" in err
    assert out[2].startswith("API this needs torch") and "download.pytorch.org/whl/cpu" in out[2]
