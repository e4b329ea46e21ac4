"""Any PyTorch model: a random-init CIFAR-style ResNet-18 (torchvision, 3x3 stem, no max-pool) through
extraction (Python and `--model package.module:factory`), the detectors, the one-call API, the grid
and the report."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

import oodeval
from oodeval import cli
from oodeval.data import resolve
from oodeval.errors import InputError
from oodeval.features import FeatureSet
from oodeval.features.backbones import parse_model_name
from oodeval.features.module import module_backbone

# float32 reductions reorder with batch shape and threads: a few ulps of the array's largest value
ULPS = 64 * float(np.finfo(np.float32).eps)

FACTORY = '''
import torch
import torchvision
from torchvision import transforms


def cifar_resnet18(num_classes=3):
    torch.manual_seed(0)
    net = torchvision.models.resnet18(num_classes=num_classes)
    net.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    net.maxpool = torch.nn.Identity()
    tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.49, 0.48, 0.45), (0.25, 0.24, 0.26))])
    return net.eval(), tf
'''


@pytest.fixture(scope="module")
def factory(tmp_path_factory):
    folder = tmp_path_factory.mktemp("usercode")
    (folder / "own_models.py").write_text(textwrap.dedent(FACTORY))
    sys.path.insert(0, str(folder))
    import own_models

    yield own_models
    sys.path.remove(str(folder))
    sys.modules.pop("own_models", None)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    colours = {"red": (200, 40, 40), "green": (40, 200, 40), "blue": (40, 40, 200)}
    for split, n in (("train", 8), ("val", 4)):
        for c, rgb in colours.items():
            for i in range(n):
                (root / split / c).mkdir(parents=True, exist_ok=True)
                a = np.clip(np.array(rgb) + rng.normal(0, 30, (32, 32, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(a).save(root / split / c / f"{i}.png")
    (root / "noise").mkdir()
    for i in range(10):
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(root / "noise" / f"{i}.png")
    return root


def test_module_features_logits_and_head_are_the_networks_own(factory, data, tmp_path):
    net, tf = factory.cifar_resnet18()
    fs = oodeval.extract_features(net, data / "val", tmp_path / "store", transform=tf, batch_size=64, progress=False)
    assert fs.features.shape == (12, 512) and fs.logits.shape == (12, 3)
    np.testing.assert_array_equal(fs.weight, net.fc.weight.detach().numpy())
    np.testing.assert_array_equal(fs.bias, net.fc.bias.detach().numpy())
    # independent: the same images, in manifest order, through the network's own layers; fc's input is the feature
    manifest = resolve(data / "val")
    x = torch.stack([tf(Image.open(manifest.resolve_path(i)).convert("RGB")) for i in range(len(manifest))])
    with torch.no_grad():
        feats = torch.flatten(torch.nn.Sequential(*list(net.children())[:-1])(x), 1).numpy()
        logits = net(x).numpy()
    np.testing.assert_allclose(fs.features, feats, rtol=1e-5, atol=ULPS * np.abs(feats).max())
    np.testing.assert_allclose(fs.logits, logits, rtol=1e-5, atol=ULPS * np.abs(logits).max())
    # cached by the parameters' content: the same module is not run again, another one is
    again = oodeval.extract_features(net, data / "val", tmp_path / "store", transform=tf, progress=False)
    assert again.meta["key"] == fs.meta["key"]
    with torch.no_grad():
        net.fc.bias += 1
    changed = oodeval.extract_features(net, data / "val", tmp_path / "store", transform=tf, progress=False)
    assert changed.meta["key"] != fs.meta["key"]


def test_bad_module_inputs_are_clear_errors(factory, data, tmp_path):
    net, tf = factory.cifar_resnet18()
    with pytest.raises(ValueError, match="transform"):
        module_backbone(net, None)
    with pytest.raises(ValueError, match="not a module"):
        module_backbone(net, tf, feature_layer="layer9")
    with pytest.raises(ValueError, match="apply to an nn.Module"):
        oodeval.extract_features("timm:test_resnet", data / "val", tmp_path, transform=tf)
    with pytest.raises(ValueError, match="no nn.Linear head"):
        module_backbone(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3)), tf)
    assert cli.main(["extract", "--model", "no_such_pkg.mod:make", "--pretrained", "none", "--dataset", str(data / "val"),
                     "--store", str(tmp_path / "s"), "--no-progress"]) == 2


def test_feature_layer_reads_a_named_module(factory, data, tmp_path):
    net, tf = factory.cifar_resnet18()
    fs = oodeval.extract_features(net, data / "val", tmp_path / "store", transform=tf, feature_layer="layer3",
                                  progress=False)
    assert fs.features.shape == (12, 256) and fs.weight is None  # fc's W does not act on layer3's output


def test_cli_factory_equals_the_python_call_and_evaluate_equals_score(factory, data, tmp_path):
    net, tf = factory.cifar_resnet18()
    store = tmp_path / "store"
    folders = {}
    for name, d in (("train", data / "train"), ("test", data / "val"), ("noise", data / "noise")):
        assert cli.main(["extract", "--model", "own_models:cifar_resnet18", "--pretrained", "none", "--dataset", str(d), "--store", str(store),
                         "--device", "cpu", "--no-progress"]) == 0
        folders[name] = max((p.parent for p in store.rglob("meta.json")), key=lambda p: p.stat().st_mtime)
    direct = oodeval.extract_features(net, data / "val", tmp_path / "store2", transform=tf, progress=False)
    via_cli = FeatureSet.load(folders["test"])
    np.testing.assert_allclose(via_cli.features, direct.features, rtol=1e-5, atol=ULPS * np.abs(direct.features).max())

    dets = ["msp", "energy", "react", "mahalanobis", "knn"]
    hps = {"knn": {"k": 3}}
    df = oodeval.evaluate(id=folders["test"], ood={"noise": folders["noise"]}, train=folders["train"],
                          detectors=dets, hyperparameters=hps, draws=200, seed=3)
    csv = tmp_path / "score.csv"
    assert cli.main(["score", "--train", str(folders["train"]), "--test", str(folders["test"]),
                     "--ood", f"noise={folders['noise']}", "--detectors", ",".join(dets), "--set", "knn.k=3",
                     "--draws", "200", "--seed", "3", "--out", str(csv), "--no-progress"]) == 0
    ref = pd.read_csv(csv, comment="#")
    cols = [c for c in df.columns if c not in ("fit_seconds", "score_seconds")]
    assert {"fpr95_lo", "fpr95_hi", "auroc_lo", "auroc_hi"} <= set(cols) and len(df) == len(dets)
    pd.testing.assert_frame_equal(df[cols].reset_index(drop=True), ref[cols], check_dtype=False, rtol=1e-12)
    assert (df["fpr95_lo"] <= df["fpr95"]).all() and (df["fpr95"] <= df["fpr95_hi"]).all()


def test_grid_and_report_run_a_user_factory_model_with_nac(factory, data, tmp_path):
    exp = tmp_path / "exp.toml"
    exp.write_text(f"""
seeds = [0]
bootstrap_draws = 50
batch_size = 16
device = "cpu"
[datasets]
id_train = "{data / 'train'}"
id_test = "{data / 'val'}"
ood = ["{data / 'noise'}"]
[[models]]
name = "own_models:cifar_resnet18"
label = "CIFAR ResNet-18"
pretrained = false
[[detectors]]
name = "energy"
[[detectors]]
name = "vim"
[[detectors]]
name = "nac"
hyperparameters = {{ n_fit = 24 }}
""")
    assert cli.main(["run", str(exp), "--no-progress", "--report", str(tmp_path / "report")]) == 0
    from oodeval.results import load_results

    df = load_results(tmp_path / "results.parquet")
    assert (df["status"] == "ok").all(), df["error"].tolist()
    assert set(df["detector"]) == {"energy", "vim", "nac"} and (df["model"] == "CIFAR ResNet-18").all()
    assert "CIFAR ResNet-18" in (tmp_path / "report" / "report.html").read_text()


def test_small_defects_name_cache_layout_and_repr(data, tmp_path):
    from oodeval.data import REGISTRY
    from oodeval.features.extract import extract

    kw = {"model_kwargs": {"num_classes": 3}, "progress": False, "device": "cpu"}
    plain = extract("test_resnet", data / "val", tmp_path, **kw)
    assert extract("timm:test_resnet", data / "val", tmp_path, **kw) == plain  # one entry, not two
    fs = FeatureSet.load(plain)
    text = repr(fs)
    assert len(text) < 300 and "features=(12, " in text and "test_resnet" in text
    assert REGISTRY["ninco-clean-cood"].layout.startswith("ninco-clean/cood/**")


def test_a_misspelt_model_prefix_is_refused_naming_the_known_ones(data, tmp_path, capsys):
    for model, guess in (("openclip:ViT-B-16", "open_clip:"), ("open-clip:RN50", "open_clip:"), ("tim:resnet18", "timm:")):
        with pytest.raises(InputError, match=f"unknown model prefix .*did you mean '{guess}'.*known prefixes: timm:, open_clip:, hf:"):
            parse_model_name(model)
    assert parse_model_name("open_clip:ViT-B-16@openai") == ("open_clip", "ViT-B-16", "openai")
    assert parse_model_name("json:loads") == ("python", "json:loads", None)  # an importable one-word module is the user's
    assert parse_model_name("no_such_pkg.mod:make") == ("python", "no_such_pkg.mod:make", None)  # a dotted path: load_factory says
    assert cli.main(["extract", "--model", "openclip:ViT-B-16", "--dataset", str(data / "val"), "--store", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("oodeval extract: error: model 'openclip:ViT-B-16': unknown model prefix 'openclip:'") and err.count("\n") == 1
    assert cli.main(["extract", "--model", "no_such_timm_model_xyz", "--pretrained", "none", "--dataset", str(data / "val"), "--store", str(tmp_path / "s"),
                     "--no-progress"]) == 2
    assert "timm has no model 'no_such_timm_model_xyz'" in capsys.readouterr().err
