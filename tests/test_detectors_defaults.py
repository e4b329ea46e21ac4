"""Per-architecture detector defaults, resolved from the model recorded with the features, and
detector details (MSP temperature, NAC's refusals)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from scipy.special import softmax

from oodeval import cli, detectors
from oodeval.detectors.defaults import backbone_family, describe_defaults, family_note, resolve_defaults
from oodeval.detectors.nac import NAC_DEFAULTS, fit_rows, nac_grid
from oodeval.experiment import run_experiment
from oodeval.features import FeatureSet
from oodeval.features.extract import extract
from oodeval.features.taps import nac_plan
from oodeval.results import load_results, save_results
from oodeval.evaluation import evaluate_detectors

TINY = {"num_classes": 3, "pretrained_cfg_overlay": {"input_size": (3, 32, 32)}}
#: one randomly initialised tiny timm model per family we can build cheaply
MODELS = {
    "resnet": ("test_resnet", TINY),
    "vit": ("test_vit", TINY),
    "deit": ("deit_tiny_patch16_224", {**TINY, "img_size": 32, "depth": 2}),
    "convnext": ("test_convnext", TINY),
    "swin": ("swin_tiny_patch4_window7_224", {**TINY, "img_size": 32, "window_size": 2, "embed_dim": 16,
                                              "depths": [1, 1, 1, 1], "num_heads": [1, 1, 1, 1]}),
    # timm's eva module: EVA02 (average-pooled, fc_norm after pooling) and DINOv3 (average-pooled, 4 registers)
    "eva": ("eva02_tiny_patch14_224", {**TINY, "pretrained_cfg_overlay": {"input_size": (3, 28, 28)}, "img_size": 28,
                                       "depth": 3, "embed_dim": 32, "num_heads": 2}),
    "dinov3": ("vit_small_patch16_dinov3", {**TINY, "depth": 4, "embed_dim": 32, "num_heads": 2}),
    "xcit": ("xcit_nano_12_p16_224", {**TINY, "img_size": 32, "depth": 2, "embed_dim": 32, "num_heads": 2}),
}
#: the family each MODELS entry resolves to
FAMILY = {"deit": "vit", "dinov3": "eva"}
VIT_NORM = {"O": 500, "M": 50, "alpha": 100.0}
VIT_BLOCKS = [{"O": 50, "M": 500, "alpha": 1.0}, {"O": 10, "M": 500, "alpha": 10.0}, {"O": 10, "M": 1000, "alpha": 1.0}]


@pytest.mark.parametrize(("model", "family"), [
    ("resnet50", "resnet"), ("timm:resnet50.a1_in1k", "resnet"), ("resnetv2_50x1_bit", "resnet"),
    ("vit_base_patch16_224.augreg_in21k", "vit"), ("deit_small_distilled_patch16_224", "vit"),
    ("swin_tiny_patch4_window7_224", "swin"), ("convnext_tiny", "convnext"), ("densenet121", "densenet"),
    ("efficientnet_b0", "efficientnet"), ("open_clip:RN50@openai", "resnet"), ("open_clip:ViT-B-16", "vit"),
    ("timm:eva02_large_patch14_448.mim_m38m_ft_in22k_in1k", "eva"), ("timm:vit_7b_patch16_dinov3.lvd1689m", "eva"),
    ("timm:vit_giant_patch14_dinov2.lvd142m", "vit"), ("xcit_medium_24_p16_224.fb_in1k", "xcit"),
    ("swinv2_base_window16_256.ms_in1k", "swin"), ("convnextv2_large", "convnext"), ("tf_efficientnetv2_m", "efficientnet"),
    ("openood:resnet18_32x32", "resnet"), ("openood:resnet18_224x224", "resnet"),
    ("regnety_040", "other"), ("no_such_model", "unknown"), (None, "unknown"),
])  # fmt: skip
def test_backbone_family_from_the_recorded_model_name(model, family):
    assert backbone_family(model) == family


def test_other_family_says_which_module_and_what_it_gets():
    note = family_note("regnety_040")
    assert "timm module regnet" in note and "p=90" in note
    assert "no ASH-S or NAC release setting" in family_note("convnext_tiny")
    assert describe_defaults(["ash_s"], {"model": "regnety_040"})[0].startswith("backbone regnety_040: family other (timm module regnet")


@pytest.mark.parametrize(("model", "maxlogit", "percentile"), [
    ("resnet50", False, 90.0), ("vit_base_patch16_224", True, 95.0), ("densenet121", True, 99.0),
    ("convnext_base", True, 90.0), ("swin_base_patch4_window7_224", True, 90.0),
    ("eva02_large_patch14_448", True, 95.0), ("vit_7b_patch16_dinov3", True, 95.0), ("xcit_medium_24_p16_224", True, 95.0),
    ("tf_efficientnet_b7", True, 90.0), ("resnetv2_101x1_bit", False, 90.0),
])  # fmt: skip
def test_release_defaults_per_family_and_explicit_values_win(model, maxlogit, percentile):
    meta = {"model": model}
    assert resolve_defaults("neco", meta) == {"maxlogit": maxlogit}
    assert resolve_defaults("ash_s", meta) == {"percentile": percentile}
    assert resolve_defaults("neco", meta, {"maxlogit": not maxlogit}) == {"maxlogit": not maxlogit}
    assert resolve_defaults("ash_s", meta, {"percentile": 70}) == {"percentile": 70}
    assert resolve_defaults("knn", meta, {"k": 5}) == {"k": 5}
    assert resolve_defaults("neco", {}) == {}  # nothing recorded: the class defaults


def test_neco_factor_stays_off_without_logits():
    fs = FeatureSet(np.ones((3, 4), np.float32), meta={"model": "open_clip:ViT-B-16"})
    assert resolve_defaults("neco", fs) == {"maxlogit": False}


def test_nac_vit_config_maps_to_timm_names_by_depth():
    taps = ["norm", "blocks.23.norm2", "blocks.22.norm2", "blocks.21.norm2"]
    hp = resolve_defaults("nac", {"model": "vit_large_patch16_224", "taps": taps, "depth": 24})
    assert hp == {"n_fit": 50000, "layer_params": dict(zip(taps, [VIT_NORM, *VIT_BLOCKS]))}
    # explicit layer params are merged per layer and key; an explicit n_fit wins
    hp = resolve_defaults("nac", {"model": "vit_large_patch16_224", "taps": taps, "depth": 24},
                          {"n_fit": 1000, "layer_params": {"norm": {"O": 7}}})
    assert hp["n_fit"] == 1000 and hp["layer_params"]["norm"] == {"O": 7, "M": 50, "alpha": 100.0}
    assert hp["layer_params"]["blocks.23.norm2"] == VIT_BLOCKS[0]
    # a tap that is not among the release's layers gets no release setting
    hp = resolve_defaults("nac", {"model": "vit_large_patch16_224", "taps": ["blocks.5.norm2"], "depth": 24})
    assert hp == {"n_fit": 50000, "layer_params": {}}
    assert resolve_defaults("nac", {"model": "resnet50", "taps": ["pre_logits", "layer3"]}) == {"n_fit": 1000}


def test_nac_vit_recipe_follows_the_recorded_roles_on_eva_and_xcit_block_names():
    taps = ["norm", "cls_attn_blocks.1.norm2", "cls_attn_blocks.0.norm2", "blocks.23.norm2"]
    meta = {"model": "xcit_medium_24_p16_224", "taps": taps, "depth": 26, "nac_roles": dict(zip(taps, range(4)))}
    assert resolve_defaults("nac", meta) == {"n_fit": 50000, "layer_params": dict(zip(taps, [VIT_NORM, *VIT_BLOCKS]))}


@pytest.mark.parametrize(("model", "final", "last", "read"), [
    ("timm:eva02_large_patch14_448.mim_m38m_ft_in22k_in1k", "fc_norm", 23, "fc_norm: pooled vector"),
    ("timm:vit_7b_patch16_dinov3.lvd1689m", "norm", 39, "norm: patch-token mean (5 prefix tokens left out)"),
    ("timm:vit_giant_patch14_dinov2.lvd142m", "norm", 39, "norm: CLS token"),
])  # fmt: skip
def test_check_plan_gives_the_vit_recipe_on_eva_and_dinov3(model, final, last, read):
    plan = nac_plan(model)  # built on the meta device: no weights, no memory
    taps = [final, *(f"blocks.{last - k}.norm2" for k in range(3))]
    assert plan["taps"] == taps and plan["depth"] == last + 1
    hp = resolve_defaults("nac", {"model": model, **plan})
    assert hp == {"n_fit": 50000, "layer_params": dict(zip(taps, [VIT_NORM, *VIT_BLOCKS]))}
    lines = describe_defaults(["ash_s", "nac"], {"model": model, **plan})
    assert any(read in line for line in lines)
    assert f"ash_s.percentile = 95.0  [ASH release config/vit_config.yml" in "\n".join(lines)


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Path]]:
    """Per family: ID train (3 classes x 4), ID test and OOD FeatureSets extracted with NAC taps."""
    root = tmp_path_factory.mktemp("defaults")
    rng = np.random.default_rng(0)
    folders = {}
    for split, classes, n in (("train", ("a", "b", "c"), 4), ("test", ("a", "b", "c"), 2), ("ood", ("x",), 5)):
        for c in classes:
            (root / split / c).mkdir(parents=True)
            for i in range(n):
                img = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) // (1 if split != "ood" else 3)
                Image.fromarray(img.astype(np.uint8)).save(root / split / c / f"{i}.png")
        folders[split] = root / split
    return {fam: {s: extract(name, folders[s], root / "store", model_kwargs=kw, taps=True, progress=False)
                  for s in folders}
            for fam, (name, kw) in MODELS.items()}  # fmt: skip


@pytest.mark.parametrize("family", list(MODELS))
def test_every_family_scores_with_its_resolved_defaults(sets, family):
    train, test, ood = (FeatureSet.load(sets[family][s]) for s in ("train", "test", "ood"))
    rows = evaluate_detectors(train, test, {"ood": ood}, ["neco", "ash_s", "nac", "energy"], progress=False)
    hp = {r["detector"]: json.loads(r["hyperparameters_resolved"]) for r in rows}
    want = FAMILY.get(family, family)
    vit = want in ("vit", "eva", "xcit")
    assert {r["backbone"] for r in rows} == {want}
    assert hp["neco"]["maxlogit"] is (family != "resnet")
    assert hp["ash_s"]["percentile"] == (95.0 if vit else 90.0)
    assert hp["energy"] == {"temperature": 1.0, "compute_dtype": "float32", "device": None}
    taps = train.meta["taps"]
    name, kw = MODELS[family]
    assert {k: train.meta[k] for k in ("taps", "nac_roles", "nac_readout", "depth")} == nac_plan(name, kw)  # what --check shows
    nac = hp["nac"]
    if vit:
        depth = train.meta["depth"]
        n_cls = 2 if want == "xcit" else 0  # XCiT's two class-attention blocks run after its blocks
        blocks = [f"blocks.{i}" for i in range(depth - n_cls)] + [f"cls_attn_blocks.{j}" for j in range(n_cls)]
        final = "fc_norm" if family == "eva" else "norm"
        assert taps == [final, *(f"{b}.norm2" for b in blocks[::-1][:3])]
        assert nac["n_fit"] == 50000
        assert nac["layer_params"] == dict(zip(taps, [VIT_NORM, *VIT_BLOCKS]))
    elif want == "resnet":
        assert taps == ["pre_logits", "layer3", "layer2", "layer1"]
        assert nac["n_fit"] == 1000 and nac["layer_params"] is None  # the class defaults, by name
    else:
        assert nac["n_fit"] == 1000 and nac["layer_params"] == dict(zip(taps, NAC_DEFAULTS.values()))
    # explicit values always win, NAC's layer params key by key
    first = taps[0]
    rows = evaluate_detectors(train, test, {"ood": ood}, ["neco", "ash_s", "nac"], progress=False, hyperparameters={
        "neco": {"maxlogit": family == "resnet"}, "ash_s": {"percentile": 80.0},
        "nac": {"n_fit": 6, "layer_params": {first: {"O": 3}}}})  # fmt: skip
    hp = {r["detector"]: json.loads(r["hyperparameters_resolved"]) for r in rows}
    assert hp["neco"]["maxlogit"] is (family == "resnet") and hp["ash_s"]["percentile"] == 80.0
    assert hp["nac"]["n_fit"] == 6 and hp["nac"]["layer_params"][first]["O"] == 3


def test_score_cli_prints_the_resolved_defaults(sets, tmp_path, capsys):
    vit = sets["vit"]
    out = tmp_path / "t.csv"
    code = cli.main(["score", "--train", str(vit["train"]), "--test", str(vit["test"]), "--ood", f"o={vit['ood']}",
                     "--detectors", "neco,ash_s,nac", "--set", "ash_s.percentile=80", "--no-progress", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    assert "family vit" in text and "neco.maxlogit = True  [NECO release" in text
    assert "ash_s.percentile = 80 (set explicitly; backbone default 95.0 [ASH release config/vit_config.yml" in text
    assert "nac.layer_params = norm 500/50/100, blocks.5.norm2 50/500/1" in text
    table = pd.read_csv(out, comment="#")
    assert set(table["backbone"]) == {"vit"}
    assert json.loads(table.set_index("detector").loc["ash_s", "hyperparameters_resolved"])["percentile"] == 80.0
    assert table.set_index("detector").loc["ash_s", "hyperparameters"] == '{"percentile":80}'  # the explicit value, as in a results table


def test_grid_rows_record_the_resolved_hyperparameters(sets, tmp_path):
    vit = {"id_train": str(sets["vit"]["train"]), "id_test": str(sets["vit"]["test"]), "ood": str(sets["vit"]["ood"])}
    cfg = {"results": str(tmp_path / "r.parquet"), "bootstrap_draws": 20, "seeds": [0],
           "datasets": {"id_train": "train", "id_test": "test", "ood": ["ood"]},
           "models": [{"name": "vit", "features": vit}],
           "detectors": ["neco", {"name": "ash_s", "hyperparameters": {"percentile": 80}}]}  # fmt: skip
    df = load_results(run_experiment(cfg, progress=False)).set_index("detector")
    assert (df["status"] == "ok").all() and set(df["backbone"]) == {"vit"}
    assert json.loads(df.loc["neco", "hyperparameters_resolved"]) == {"dim": None, "maxlogit": True, "variance": 0.9,
                                                                       "compute_dtype": "float32", "device": None}
    assert json.loads(df.loc["ash_s", "hyperparameters_resolved"]) == {"percentile": 80, "compute_dtype": "float32", "device": None}
    assert df.loc["ash_s", "hyperparameters"] == '{"percentile":80}'


def test_msp_temperature():
    rng = np.random.default_rng(0)
    f = (rng.normal(size=(40, 7)) * 5).astype(np.float32)
    fs = FeatureSet(np.zeros((40, 2), np.float32), logits=f)
    for t in (1.0, 0.5, 1000.0):
        want = softmax(f.astype(np.float64) / t, axis=1).max(axis=1)
        got = detectors.create("msp", temperature=t, compute_dtype="float64").fit().score(fs)
        np.testing.assert_allclose(got, want, rtol=1e-13)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"detector 'msp': temperature=.* must be a number > 0"):
            detectors.create("msp", temperature=bad)


def test_nac_refuses_odd_m_and_n_fit_below_the_class_count():
    assert nac_grid(50).size == 50
    for m in (49, 3, 1):
        with pytest.raises(ValueError, match="even M >= 4"):
            nac_grid(m)
    labels = np.repeat(np.arange(10), 5)
    with pytest.raises(ValueError, match="n_fit=9 is below the 10 classes"):
        fit_rows(labels, 9, 0)
    rows = fit_rows(labels, 25, 0)  # 2 per class, seeded and sorted
    assert rows.size == 20 and np.bincount(labels[rows]).tolist() == [2] * 10
    assert np.array_equal(rows, fit_rows(labels, 25, 0)) and np.all(np.diff(rows) > 0)
    assert np.array_equal(fit_rows(labels, None, 0), np.arange(50))
    st = np.random.default_rng(0).normal(size=(50, 4)).astype(np.float32)
    train = FeatureSet(np.zeros((50, 2), np.float32), labels=labels, extras={"nac/pre_logits": st})
    with pytest.raises(ValueError, match="layer_params=.* must be a table {layer: {O: a number > 0, M: an even integer >= 4"):
        detectors.create("nac", n_fit=None, layer_params={"pre_logits": {"M": 51}})
    with pytest.raises(ValueError, match="below the 10 classes"):
        detectors.create("nac", n_fit=5).fit(train)


def test_grid_recomputes_cells_recorded_before_defaults_were_resolved(sets, tmp_path):
    vit = {"id_train": str(sets["vit"]["train"]), "id_test": str(sets["vit"]["test"]), "ood": str(sets["vit"]["ood"])}
    cfg = {"results": str(tmp_path / "r.parquet"), "bootstrap_draws": 20, "seeds": [0],
           "datasets": {"id_train": "train", "id_test": "test", "ood": ["ood"]},
           "models": [{"name": "vit", "features": vit}], "detectors": ["neco", "energy"]}  # fmt: skip
    assert run_experiment(cfg, progress=False).computed == 2
    assert run_experiment(cfg, progress=False).computed == 0
    old = load_results(cfg["results"])  # a table written before per-backbone defaults: no resolved column
    old.loc[old["detector"] == "neco", "hyperparameters_resolved"] = None
    save_results(old.drop(columns=["backbone"]), cfg["results"])  # oodeval's own table (it carries the marker)
    again = run_experiment(cfg, progress=False)
    assert (again.computed, again.skipped) == (1, 1)
    df = load_results(cfg["results"]).set_index("detector")
    assert json.loads(df.loc["neco", "hyperparameters_resolved"])["maxlogit"] is True


def test_grid_takes_the_backbone_of_precomputed_features_without_a_recorded_model_from_its_name(tmp_path):
    rng = np.random.default_rng(0)
    w, b = rng.normal(size=(3, 6)).astype(np.float32), np.zeros(3, np.float32)
    paths = {}
    for role, n in (("id_train", 30), ("id_test", 12), ("ood", 12)):
        z = np.abs(rng.normal(size=(n, 6))).astype(np.float32)
        y = rng.integers(0, 3, n) if role != "ood" else None
        paths[role] = str(FeatureSet(z, labels=y, logits=z @ w.T + b, weight=w, bias=b).save(tmp_path / role))
    cfg = {"results": str(tmp_path / "r.parquet"), "bootstrap_draws": 20, "seeds": [0],
           "datasets": {"id_train": "train", "id_test": "test", "ood": ["ood"]},
           "models": [{"name": "deit_small_patch16_224", "features": paths}, {"name": "mine", "features": paths}],
           "detectors": ["neco"]}  # fmt: skip
    df = load_results(run_experiment(cfg, progress=False)).set_index("model")
    assert df.loc["deit_small_patch16_224", "backbone"] == "vit" and df.loc["mine", "backbone"] == "unknown"
    assert json.loads(df.loc["deit_small_patch16_224", "hyperparameters_resolved"])["maxlogit"] is True
    assert json.loads(df.loc["mine", "hyperparameters_resolved"])["maxlogit"] is False


def test_neco_keeps_the_standardised_norm_on_swin_and_deit_because_the_release_ratio_depends_on_the_origin():
    """NECO's release divides ||P s(x)|| (s = standardised) by the RAW norm ||x|| for DeiT and Swin.
    A constant shift of every feature (a LayerNorm bias: train and test alike) leaves s(x) and the
    numerator unchanged but moves ||x||, so the release's ranking depends on where the origin of
    the feature space lies; oodeval's standardised ratio does not (docs/detectors.md)."""
    from scipy.stats import spearmanr

    rng = np.random.default_rng(0)
    grid = lambda a: (np.round(a * 1024) / 1024).astype(np.float32)  # noqa: E731 - multiples of 2^-10: x + 4 is exact
    train = FeatureSet(grid(rng.normal(size=(400, 16)) * np.linspace(0.5, 3, 16)))
    test = FeatureSet(grid(rng.normal(size=(200, 16)) * 2.0))
    shift = np.full(16, 4.0, np.float32)
    shifted = [FeatureSet(fs.features + shift) for fs in (train, test)]

    def both(tr, te):
        det = detectors.create("neco", dim=4, compute_dtype="float64").fit(tr)
        z = te.features.astype(np.float64)
        num = np.linalg.norm(((z - det.mean_) / det.scale_) @ det.components_, axis=1)
        return det.score(te), num / np.linalg.norm(z, axis=1)  # ours, the release's DeiT/Swin ratio

    ours, release = both(train, test)
    ours_shifted, release_shifted = both(*shifted)
    np.testing.assert_allclose(ours_shifted, ours, rtol=1e-10)
    assert spearmanr(release, release_shifted).statistic < 0.95  # 0.894 here: the ranking moved with the origin
