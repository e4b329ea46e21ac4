"""The paper as a preset and as report views: the shipped experiment resolves offline, the
published numbers match the paper's text, and every paper view renders from a synthetic grid
that holds its data (and says "omitted: why" when it does not)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from oodeval import cli
from oodeval.experiment import load_config
from oodeval.report import build_views, save_sweep, write_report
from oodeval.report.reference import TABLES, load_reference
from oodeval.report.views import Cell
from oodeval.results import hp_json, load_results, save_results

PRESET = Path(__file__).resolve().parents[1] / "examples" / "fi-imagenet-1k.toml"

# Lines copied verbatim from the paper's text (Tabs. 1, 2, 3, A1, A2, A5, A7)
PAPER_LINES = {
    "tab1": "EVA02-L-448\t305.1M\t91.5\t65.0\tMaha++\t84.2\trMaha++",
    "tab2": "SigLIP2-g [47]\t71.8\t64.6\t68.9\t51.3\t51.2\t6.0",
    "tab3": "Species [21]\t10 000\t40.2\tMaha\t88.4\tViM",
    "tabA1": "NAC\t96.6 / 55.0\t73.3 / 67.5\t72.4 / 71.4\t69.2 / 68.0\t73.0 / 79.2\t74.8 / 71.0\t66.9 / 70.0\t78.2 / 68.6",
    "tabA2": "Textures\t33.7\t/ 91.2\t28.0\t/ 92.6\t24.1\t/ 93.9\t22.0\t/ 94.0\t22.3\t/ 94.0\t25.4\t/ 94.1\t21.2\t/ 94.1\t22.4\t/ 94.5\t24.9\t/ 93.5",
    "tabA5": "Textures\t5 640\t66.4\t72.4\t67.9\t7.5",
    "tabA7": "EffNet-b7-ns\tJFT-300M (ns)\t66.3M\t89.6\t75.4\trMaha++\t77.2\trMaha++",
}


def test_reference_cells_match_the_papers_text():
    t1 = load_reference("tab1").set_index("model")
    assert t1.loc["EVA02-L-448", ["params", "top1", "fpr95", "fpr95_detector", "auroc", "auroc_detector"]].tolist() == [
        "305.1M", 91.5, 65.0, "mahalanobis_pp", 84.2, "relative_mahalanobis_pp"]  # fmt: skip
    assert PAPER_LINES["tab1"].split("\t")[3] == "65.0"
    t2 = load_reference("tab2")
    sig = t2[t2["model"] == "SigLIP2-g"].set_index("vocabulary")["fpr95"]
    assert [f"{v:.1f}" for v in sig[["logit-sp.", "EOE", "WN", "GPT", "WN+GPT", "oracle"]]] == PAPER_LINES["tab2"].split("\t")[1:]
    t3 = load_reference("tab3").set_index("dataset")
    assert (t3.loc["Species", "n"], t3.loc["Species", "fpr95"], t3.loc["Species", "fpr95_detector"]) == (10000, 40.2, "mahalanobis")
    a1 = load_reference("tabA1")
    nac = a1[a1["detector"] == "nac"]
    assert [f"{f:.1f} / {a:.1f}" for f, a in zip(nac["fpr95"], nac["auroc"])] == PAPER_LINES["tabA1"].split("\t")[1:]
    # Tabs. 1 / A1 print the ImageNet-21k checkpoints under short names; the reference keeps both
    assert set(nac["paper_label"]) >= {"ViT-B/16-384", "SwinV2-B-256"} and set(nac["model"]) >= {"ViT-B-384-21k", "SwinV2-B-256-21k"}
    a2 = load_reference("tabA2")
    tex = a2[a2["dataset"] == "Textures"]
    parts = PAPER_LINES["tabA2"].split("\t")[1:]
    assert [f"{f:.1f}" for f in tex["fpr95"]] == parts[0::2] and [f"/ {a:.1f}" for a in tex["auroc"]] == parts[1::2]
    a5 = load_reference("tabA5")
    assert a5[a5["dataset"] == "Textures"]["fpr95"].tolist() == [66.4, 72.4, 67.9, 7.5]
    assert a5[a5["dataset"] == "iNat-OOD Plants"]["fpr95"].isna().sum() == 1  # the paper's "–" (no oracle)
    a7 = load_reference("tabA7").set_index("model")
    assert len(a7) == 30 and a7.loc["EffNet-b7-ns", "pretraining"] == "JFT-300M (ns)" and a7.loc["EffNet-b7-ns", "fpr95"] == 75.4
    assert a7.loc["EVA02-L-448", "timm_checkpoint"] == "eva02_large_patch14_448.mim_m38m_ft_in22k_in1k"
    with pytest.raises(ValueError, match="no reference table"):
        load_reference("tab9")
    assert all(len(load_reference(t)) for t in TABLES)


def test_preset_names_the_papers_grid_and_resolves_offline(capsys, monkeypatch):
    import open_clip
    import timm

    from oodeval import detectors, zeroshot

    cfg = load_config(PRESET)
    sup = [m for m in cfg.models if m.kind == "supervised"]
    vlm = [m for m in cfg.models if m.kind == "zero-shot"]
    assert len(sup) == 30 and len(vlm) == 8
    assert {m.label for m in sup} == set(load_reference("tabA7")["model"])
    assert {m.label for m in vlm} == set(load_reference("tab2")["model"]) - {"Mean"}
    assert [d.name for d in cfg.detectors] == detectors.names("paper21")  # the 21, in the paper's order
    assert {d.name for d in cfg.zeroshot if d.vocabulary is None} == set(zeroshot.scorer_names("logit"))
    assert len([d for d in cfg.zeroshot if d.vocabulary is None]) == 7
    # Tab. 2 / A4: 30 EOE generations per prompt, 10 GPT generations; the unions; Fig. A1, A2, A3 sweeps
    from collections import Counter

    from oodeval.experiment.zeroshot import vocabulary_generation, vocabulary_label

    vocabs = Counter(vocabulary_generation(vocabulary_label(d.vocabulary))[0] for d in cfg.zeroshot if d.vocabulary)
    assert vocabs == {"EOE": 30, "EOE-far-OOD": 30, "EOE-near-OOD": 30, "GPT": 10, "WN": 1, "WN+GPT": 1, "WN20000+GPT": 1, "oracle": 1}
    assert {(s.name, s.kind) for s in cfg.sweeps} == {("wordnet_size", "prefix"), ("siblings_k", "siblings"), ("merged_pool", "siblings")}
    assert cfg.eoe_prompts is not None and cfg.eoe_prompts.name == "eoe-release.toml"
    ckpt = dict(zip(load_reference("tabA7")["model"], load_reference("tabA7")["timm_checkpoint"]))
    pretrained, archs = set(timm.list_pretrained()), set(timm.list_models())
    for m in sup:
        name = m.name.removeprefix("timm:")
        assert name.split(".")[0] in archs, name
        assert "." not in name or name in pretrained, name  # an explicit tag is a real timm checkpoint
        assert ckpt[m.label].split(" + ")[0] in name or m.head, (m.label, name)  # Tab. A8's checkpoint (probes: the backbone)
    assert {m.label for m in sup if m.head} == {"DINOv2-g/14", "DINOv3-7B"}
    pairs = set(open_clip.list_pretrained())
    for m in vlm:
        if m.name.startswith("hf:"):
            from transformers import CONFIG_MAPPING

            assert m.name == "hf:apple/aimv2-large-patch14-224-lit" and "aimv2" in CONFIG_MAPPING
            continue
        arch, _, tag = m.name.removeprefix("open_clip:").partition("@")
        assert (arch, tag) in pairs, m.name
    labels = [d.label for d in cfg.ood]
    assert labels[0] == "Fi-ImageNet-1k" and len(labels) == 1 + 14 + 11
    assert {d.label for d in cfg.ood} >= set(load_reference("tab3")["dataset"])
    # `run --check --names-only` (as in CI, before checkpoints and data are downloaded): every model name
    # resolves and the backbone-dependent defaults are printed per model
    assert cli.main(["run", str(PRESET), "--check", "--names-only"]) == 0
    out = capsys.readouterr().out
    assert "38 model(s)" in out and "AIMv2-L" in out and "neglabel[WN+GPT]" in out and "check passed" in out
    assert "eoe[EOE-gen{0..29}]" in out and "neglabel[GPT-gen{0..9}]" in out
    assert "note: EOE's released prompts" in out and "are not in place" in out  # the user provides them
    assert "family vit" in out and "family resnet" in out and "neco.maxlogit = True" in out
    # every one of the 30 classifiers resolves to a named family, on purpose (Tab. A8)
    families = [line.split(": family ")[1].split(" ")[0] for line in out.splitlines() if ": family " in line]
    assert len(families) == 30 and not {"other", "unknown"} & set(families), families
    assert {"resnet", "vit", "eva", "xcit", "swin", "convnext", "efficientnet"} == set(families)
    for label, recipe in (("EVA02-L-448", "fc_norm 500/50/100, blocks.23.norm2 50/500/1, blocks.22.norm2 10/500/10, blocks.21.norm2 10/1000/1"),
                          ("DINOv3-7B", "norm 500/50/100, blocks.39.norm2 50/500/1, blocks.38.norm2 10/500/10, blocks.37.norm2 10/1000/1")):
        block = re.split(r"\n  (?=\S)", out.split(f"  {label} (supervised, taps)")[1])[0]  # the model's own lines
        assert "ash_s.percentile = 95.0" in block and f"nac.layer_params = {recipe}" in block and "nac.n_fit = 50000" in block
    assert sum(m.taps for m in sup) == 30  # NAC on every classifier, the probes included
    # the full check also lists the missing inputs, and only those (on any disk), and each VLM's extraction disk
    from oodeval.experiment import disk
    from oodeval.experiment.check import check_experiment

    monkeypatch.setattr(disk, "free_bytes", lambda path: 10**15)
    assert cli.main(["run", str(PRESET), "--check"]) == 2
    out = capsys.readouterr().out
    assert "CLIP-B/16: extraction writes " in out and "(2.07 kB per image: embedding + 1 patch readout(s); full patch tokens would add 201 kB)" in out
    assert "SigLIP2-g: extraction writes " in out and "full patch tokens would add 1.77 MB" in out
    problems = check_experiment(cfg)
    assert problems and all("does not exist" in p or "not found" in p for p in problems), problems
    assert sum("EOE-gen{0..29}.json does not exist" in p for p in problems) == 1  # the 30 generations in one line


# ---------------------------------------------------------------- a synthetic grid of the paper's shape
def _row(model, kind, det, dataset, fpr, auroc, vocab=None, acc=0.8, n=100, ci=0.02, label=None):
    hp = {"vocabulary": vocab} if vocab else {}
    return dict(model=model, weights="", detector=det, hyperparameters=hp_json(hp), dataset=dataset, split="all", seed=0,
                fpr95=fpr, fpr95_lo=fpr - ci, fpr95_hi=fpr + ci, tnr95=1 - fpr, auroc=auroc, auroc_lo=auroc - ci, auroc_hi=auroc + ci,
                detection_error=0.3, id_accuracy=acc, n_id=500, n_ood=n, kind=kind, label=label or det, vocabulary=vocab, status="ok")  # fmt: skip


def _grid() -> list[dict]:
    rows = []
    sets = {"Fi-ImageNet-1k": 655, "Textures": 5640, "Textures (clean)": 288, "NINCO": 5879}
    for model, acc, shift in (("EVA02-L-448", 0.915, 0.0), ("ResNet50", 0.849, 0.10)):
        for d, n in sets.items():
            base = {"Fi-ImageNet-1k": 0.65, "Textures": 0.212, "Textures (clean)": 0.10, "NINCO": 0.169}[d] + shift
            rows.append(_row(model, "supervised", "mahalanobis_pp", d, base, 0.84, acc=acc, n=n))
            rows.append(_row(model, "supervised", "msp", d, base + 0.05, 0.86, acc=acc, n=n))
    for model in ("CLIP-B/16", "SigLIP2-g"):
        for d in ("Fi-ImageNet-1k", "NINCO"):
            rows.append(_row(model, "zero-shot", "mcm", d, 0.80, 0.70, acc=0.7))
            for vocab, fpr in (("fine-grained-gen1", 0.70), ("fine-grained-gen2", 0.74), ("far-OOD", 0.85), ("WN", 0.78)):
                rows.append(_row(model, "zero-shot", "neglabel" if vocab == "WN" else "eoe", d, fpr, 0.7, vocab=vocab, acc=0.7))
            for g, fpr in enumerate((0.72, 0.74, 0.75)):  # three LLM generations of the GPT siblings
                rows.append(_row(model, "zero-shot", "neglabel", d, fpr, 0.7, vocab=f"GPT-gen{g}", acc=0.7))
    return rows


@pytest.fixture
def grid(tmp_path):
    path = tmp_path / "results.parquet"
    save_results(pd.DataFrame(_grid()), path)
    return path


def _view(views, key):
    return next(v for v in views if v.key == key)


def test_tab3_and_tabA3_on_the_best_top1_model(grid):
    views, _ = build_views(load_results(grid), grid, primary="Fi-ImageNet-1k", draws=10)
    t3 = _view(views, "tab3")
    assert "EVA02-L-448" in t3.caption  # the best Top-1 supervised model, as the paper
    frame = t3.frame.set_index("Dataset")
    assert list(frame.index) == ["Textures", "NINCO", "Fi-ImageNet-1k"]  # cleaned sub-samples apart, primary last
    assert frame.loc["Textures", "FPR@95"] == "21.2 [19.2, 23.2]" and frame.loc["Textures", "FPR detector"] == Cell("Maha++", title="mahalanobis_pp")
    assert frame.loc["NINCO", "n"] == "5879" and frame.loc["NINCO", "AUROC detector"].title == "msp"
    assert not any(c.muted for c in frame["FPR detector"])  # detector names in full contrast
    a3 = _view(views, "tabA3").frame.iloc[0]
    assert a3["Dataset"] == "Textures" and a3["n clean"] == "288" and a3["%"] == f"{100 * 288 / 5640:.1f}"
    assert a3["FPR@95 clean"] == "10.0 [8.0, 12.0]" and a3["ΔFPR"] == "-11.2"


def test_tabA4_eoe_prompts_mean_over_models_and_generations(grid):
    views, _ = build_views(load_results(grid), grid, primary="Fi-ImageNet-1k", draws=10)
    a4 = _view(views, "tabA4").frame.set_index("Dataset")
    assert list(a4.columns) == ["MCM", "fine-grained", "far-OOD"]
    fg = a4.loc["Fi-ImageNet-1k", "fine-grained"]
    # generations 70 and 74 (each the mean of two models): mean 72.0, std (ddof=1) 2.83
    assert str(fg) == f"72.0 ± {np.std([70, 74], ddof=1):.1f}" and fg.bold
    far = a4.loc["Fi-ImageNet-1k", "far-OOD"]
    assert str(far) == "85.0" and not far.bold and not far.underline  # loses to MCM (80.0) and to fine-grained
    assert a4.loc["Fi-ImageNet-1k", "MCM"] == "80.0"


def test_tabA7_and_the_paper_comparison(grid):
    views, _ = build_views(load_results(grid), grid, primary="Fi-ImageNet-1k", draws=10)
    t1 = _view(views, "tab1").frame.set_index("Model")
    assert t1.loc["EVA02-L-448", "Params"] == "305.1M" and t1.loc["SigLIP2-g", "Params"] == "1.9B"
    a7 = _view(views, "tabA7").frame
    assert list(a7["Model"]) == ["ResNet50", "EVA02-L-448"]  # worst FPR@95 first
    eva = a7.set_index("Model").loc["EVA02-L-448"]
    assert (eva["Pre-training"], eva["Params"], eva["FPR@95"]) == ("MIM + ImageNet-21k", "305.1M", "65.0 [63.0, 67.0]")
    cmp = _view(views, "paper").frame
    shown = cmp["Detector"].map(str)
    cmp = cmp.assign(Detector=[c.title if isinstance(c, Cell) else c for c in cmp["Detector"]])  # keyed on registry names
    assert "best: Maha++ (paper: Maha++)" in set(shown) and "best: mahalanobis_pp (paper: mahalanobis_pp)" in set(cmp["Detector"])
    eva1 = cmp[(cmp["Table"] == "tab1") & (cmp["Model"] == "EVA02-L-448") & (cmp["Metric"] == "FPR@95")].iloc[0]
    assert (eva1["Paper"], eva1["Δ"], eva1["Flag"]) == ("65.0", "+0.0", "")  # 65.0 inside [63.0, 67.0]
    res1 = cmp[(cmp["Table"] == "tab1") & (cmp["Model"] == "ResNet50") & (cmp["Metric"] == "FPR@95")].iloc[0]
    assert (res1["Paper"], res1["Flag"]) == ("80.2", "outside CI")  # ours 75.0 [73.0, 77.0]
    a1 = cmp[(cmp["Table"] == "tabA1") & (cmp["Model"] == "EVA02-L-448") & (cmp["Detector"] == "msp") & (cmp["Metric"] == "AUROC")].iloc[0]
    assert a1["Paper"] == "74.4" and a1["Flag"] == "outside CI"  # ours 86.0 [84.0, 88.0]
    t2 = cmp[(cmp["Table"] == "tab2") & (cmp["Model"] == "SigLIP2-g") & (cmp["Detector"] == "WN")].iloc[0]
    assert t2["Ours [95% CI]"] == "78.0 [76.0, 80.0]" and t2["Paper"] == "68.9"
    # a vocabulary of several generations: their mean, CI mean ± 1.96 std / sqrt(n), beside the paper's mean over its 10
    gpt = cmp[(cmp["Table"] == "tab2") & (cmp["Model"] == "SigLIP2-g") & (cmp["Detector"] == "GPT")].iloc[0]
    gens = np.array([72.0, 74.0, 75.0])
    half = 1.96 * gens.std(ddof=1) / np.sqrt(3)
    assert gpt["Ours [95% CI]"] == f"{gens.mean():.1f} [{gens.mean() - half:.1f}, {gens.mean() + half:.1f}], ± {gens.std(ddof=1):.1f} over 3 gen."
    assert (gpt["Paper"], gpt["Flag"]) == ("51.3 over 10 gen.", "outside CI")
    tab2 = _view(views, "tab2").frame.set_index("Model")
    assert str(tab2.loc["SigLIP2-g", "GPT"]) == f"{gens.mean():.1f} ± {gens.std(ddof=1):.1f} (3 gen.)"
    a5 = cmp[(cmp["Table"] == "tabA5") & (cmp["OOD set"] == "NINCO")].iloc[0]
    assert a5["Flag"] == "no CI" and a5["Paper"] == "44.9"  # a mean over VLMs carries no CI
    assert "of" in _view(views, "paper").caption and "flagged" in _view(views, "paper").caption


def test_figures_A3_and_gallery_and_omitted_notes(grid, tmp_path):
    from PIL import Image

    for model, shift in (("CLIP-B/16", 0.0), ("SigLIP2-g", 0.1)):
        for d in ("Fi-ImageNet-1k", "NINCO"):
            save_sweep(grid, "merged_pool", model, d, [1, 5, 20], [0.6 + shift, 0.55 + shift, 0.58 + shift])
    export = tmp_path / "export"
    (export / "img").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(20):
        Image.fromarray(rng.integers(0, 255, (40, 50, 3), dtype=np.uint8)).save(export / "img" / f"{i}.png")
    # the columns `oodeval construct export` writes, paths relative to the export folder
    pd.DataFrame({"path": [f"img/{i}.png" for i in range(20)], "label": -1, "ood_label": [f"tayra {i}" for i in range(20)],
                  "fine_grained": 1, "original_label": 3, "original_name": "weasel", "flag": "uncertain", "decided_stage": 2,
                  "other_labels": ""}).to_csv(export / "ood.csv", index=False)  # fmt: skip
    from matplotlib.colors import to_rgb

    from oodeval.report import figures
    from oodeval.report.paper_views import gallery_items

    items = gallery_items(export, 14)
    assert len(items) == 14 and len({i[0] for i in items + gallery_items(export, 42, skip=14)}) == 20  # Fig. A5 continues Fig. 2
    ax = figures.gallery(items, "Fig. 2").axes[0]
    assert ax.title.get_text() == items[0][1] and to_rgb(ax.title.get_color()) == to_rgb("green")
    assert [(t.get_text(), to_rgb(t.get_color())) for t in ax.texts] == [("weasel", to_rgb("red"))]
    paths = write_report(grid, tmp_path / "rep", primary="Fi-ImageNet-1k", draws=10, gallery=export)
    for key in ("figA3", "fig2", "figA5"):
        assert paths[key].read_bytes()[:4] == b"\x89PNG" and paths[key].with_suffix(".pdf").is_file(), key
    md = paths["markdown"].read_text()
    assert "Tab. A7" in md and "Tab. 3" in md and "Tab. A3" in md and "Paper comparison" in md
    # without the data: each view says why
    bare = tmp_path / "bare.parquet"
    save_results(pd.DataFrame([r for r in _grid() if r["model"] == "ResNet50" and "clean" not in r["dataset"]]), bare)
    md = write_report(bare, tmp_path / "rep2", primary="Fi-ImageNet-1k", draws=10, formats=("png",))["markdown"].read_text()
    for note in ("no OOD set has a cleaned sub-sample", "no EOE results with a vocabulary", "no sweep named 'merged...'",
                 "no construction export given"):  # fmt: skip
        assert f"omitted: {note}" in md, note
    with pytest.raises(FileNotFoundError, match="no ood.csv"):
        write_report(grid, tmp_path / "rep3", draws=10, gallery=tmp_path)


def test_tabA5_mean_rows_per_group(tmp_path):
    rows = _grid() + [_row(m, "zero-shot", "neglabel", "Textures", fpr, 0.7, vocab="WN", acc=0.7, n=5640) for m, fpr in (("CLIP-B/16", 0.40), ("SigLIP2-g", 0.50))]
    path = tmp_path / "r.parquet"
    save_results(pd.DataFrame(rows), path)
    groups = {"NINCO": "curated", "Textures": "full-size"}
    views, _ = build_views(load_results(path), path, primary="Fi-ImageNet-1k", draws=10, groups=groups)
    a5 = _view(views, "tabA5").frame
    a5 = a5.assign(Dataset=[str(x) for x in a5["Dataset"]]).set_index("Dataset")
    assert list(a5.index) == ["NINCO", "Textures", "Mean", "Mean (curated)", "Mean (full-size)", "Fi-ImageNet-1k"]
    assert a5.loc["Textures", "WN"].text == "45.0"  # the mean of two VLMs, no CI
    assert a5.loc["Mean", "WN"] == "61.5"  # (78.0 + 45.0) / 2
    assert a5.loc["Mean (full-size)", "WN"] == "45.0" and a5.loc["Mean (curated)", "WN"] == "78.0"
    assert a5.loc["Mean", "far-OOD"] == "85.0"  # only NINCO has it
