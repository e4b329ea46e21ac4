"""End to end: generated image folders -> random-init timm test_resnet -> grid -> every report file;
a rerun extracts nothing and computes nothing new."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from oodeval import cli
from oodeval.results import load_results

COLOURS = {"red": (200, 40, 40), "green": (40, 200, 40), "blue": (40, 40, 200)}


def _image(path, rgb, rng) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    a = np.clip(np.array(rgb) + rng.normal(0, 30, (20, 20, 3)), 0, 255).astype(np.uint8)
    Image.fromarray(a).save(path)


def make_data(root) -> None:
    rng = np.random.default_rng(0)
    for split, n in (("train", 6), ("val", 4)):
        for c, rgb in COLOURS.items():
            for i in range(n):
                _image(root / split / c / f"{i}.png", rgb, rng)
    for i in range(14):
        _image(root / "gray" / f"{i}.png", (128, 128, 128), rng)
    lines = ["path,label,fine_grained"]
    for i in range(10):
        _image(root / "fi" / f"{i}.png", (200, 200, 40) if i % 2 else (170, 60, 60), rng)
        lines.append(f"{i}.png,-1,{'false' if i % 2 else 'true'}")
    (root / "fi" / "manifest.csv").write_text("\n".join(lines) + "\n")


def test_tiny_end_to_end_run_and_report(tmp_path, capsys):
    make_data(tmp_path / "data")
    exp = tmp_path / "exp.toml"
    exp.write_text(
        """
name = "tiny"
seeds = [0]
bootstrap_draws = 50
batch_size = 16
device = "cpu"
[datasets]
id_train = "data/train"
id_test = "data/val"
ood = [{ name = "data/fi", label = "Fi", split_column = "fine_grained" }, "data/gray"]
[[models]]
name = "timm:test_resnet"
label = "test_resnet"
pretrained = false
model_kwargs = { num_classes = 3 }
[[detectors]]
name = "msp"
[[detectors]]
name = "energy"
[[detectors]]
name = "mahalanobis"
"""
    )
    assert cli.main(["run", str(exp), "--no-progress", "--report", str(tmp_path / "report")]) == 0
    out = capsys.readouterr().out
    assert "12 cells: 0 already done, 12 computed (0 failed), 3 detector fits" in out
    df = load_results(tmp_path / "results.parquet")
    assert (df["status"] == "ok").all() and len(df) == 12
    fi = df[(df["dataset"] == "Fi") & (df["detector"] == "msp")].set_index("split")
    assert fi.loc["all", "n_ood"] == 10 and fi.loc["fine_grained=True", "n_ood"] == 5 == fi.loc["fine_grained=False", "n_ood"]
    assert (df["n_id"] == 12).all() and df["id_accuracy"].between(0, 1).all()
    assert df["random_init"].all()  # pretrained = false: recorded per cell, with the features and in the report
    assert all(json.loads(p.read_text())["random_init"] is True for p in (tmp_path / "store").rglob("meta.json"))
    assert "RANDOM-INIT WEIGHTS: test_resnet ran with randomly initialised weights" in (tmp_path / "report" / "report.md").read_text()
    for name in ("report.md", "report.tex", "report.html", "figures/fig1_best_per_dataset.png", "figures/roc.png", "figures/histograms.png", "figures/figA4_subsampling.png"):
        assert (tmp_path / "report" / name).stat().st_size > 0, name
    before = (tmp_path / "results.parquet").read_bytes()
    assert cli.main(["run", str(exp), "--no-progress"]) == 0
    assert "12 cells: 12 already done, 0 computed (0 failed), 0 detector fits" in capsys.readouterr().out
    assert (tmp_path / "results.parquet").read_bytes() == before
    # one cached FeatureSet per dataset, nothing extracted twice
    assert len([p for p in (tmp_path / "store").rglob("meta.json") if p.parent.parent.parent == tmp_path / "store"]) == 4


def test_no_silent_random_weights(tmp_path, capsys):
    """``extract`` and ``run --check`` without a weights choice are refused with the hint; chosen random init is stated."""
    make_data(tmp_path / "data")
    store = tmp_path / "store"
    assert cli.main(["extract", "--model", "test_resnet", "--dataset", str(tmp_path / "data" / "val"), "--store", str(store), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("oodeval extract: error: --model test_resnet: no weights chosen; give --weights FILE") and "--pretrained none" in err
    assert not store.exists()  # refused before any work
    exp = tmp_path / "exp.toml"
    body = ('[datasets]\nid_train = "data/train"\nid_test = "data/val"\nood = ["data/gray"]\n'
            '[[models]]\nname = "timm:test_resnet"\nmodel_kwargs = { num_classes = 3 }\n{choice}[[detectors]]\nname = "msp"\n')
    exp.write_text(body.replace("{choice}", ""))
    assert cli.main(["run", str(exp), "--check"]) == 2
    err = capsys.readouterr().err
    assert "model 'timm:test_resnet': no weights chosen" in err and "pretrained = false (random init, on purpose)" in err
    exp.write_text(body.replace("{choice}", "pretrained = false\n"))
    assert cli.main(["run", str(exp), "--check"]) == 0
    out = capsys.readouterr().out
    assert "weights: RANDOM INIT (pretrained = false), seed 0" in out
    assert "note: timm:test_resnet extract with RANDOM weights (pretrained = false)" in out
    assert cli.main(["extract", "--model", "test_resnet", "--pretrained", "none", "--model-kwargs", '{"num_classes": 3}',
                     "--dataset", str(tmp_path / "data" / "val"), "--store", str(store), "--no-progress"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "RANDOM-INIT weights (--pretrained none)" in out
    assert json.loads((Path(out.splitlines()[0]) / "meta.json").read_text())["random_init"] is True


def test_tiny_zero_shot_run_encodes_labels_with_the_text_tower(tmp_path, tiny_clip):
    make_data(tmp_path / "data")
    (tmp_path / "classes.txt").write_text("red\ngreen\nblue\n")
    (tmp_path / "neg.txt").write_text("yellow\ngray\nolive\n")
    exp = {
        "seeds": [0],
        "bootstrap_draws": 20,
        "device": "cpu",
        "datasets": {"id_test": "data/val", "ood": ["data/gray"], "id_classes": "classes.txt"},
        "models": [{"name": f"open_clip:{tiny_clip}", "label": "tiny", "kind": "zero-shot", "pretrained": False}],
        "zeroshot": ["mcm", {"name": "neglabel", "vocabulary": "neg.txt"}],
    }
    from oodeval.experiment import load_config, run_experiment

    summary = run_experiment(load_config(exp, base_dir=tmp_path), progress=False)
    df = load_results(summary.results)
    assert (df["status"] == "ok").all(), df["error"].tolist()
    assert list(df["vocabulary"].fillna("-")) == ["-", "neg"]
    assert (df["n_id"] == 12).all() and (df["n_ood"] == 14).all()
    # label embeddings are cached under the store: a second context encodes nothing new
    assert any((tmp_path / "store" / "text").rglob("shard-*.npz"))
