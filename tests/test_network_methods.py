"""The methods that need the network (ODIN, Mahalanobis with preprocessing and its layer ensemble,
Gram, RankFeat, MC dropout): their extraction passes, caching, CLI and experiment runs, each
re-derived from its paper's formula on a tiny random-init ResNet, and against pytorch-ood."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from scipy.stats import spearmanr

from oodeval import detectors
from oodeval.cli import main
from oodeval.data import Manifest
from oodeval.errors import InputError
from oodeval.features import FeatureSet
from oodeval.features import passes as passes_mod
from oodeval.features.backbones import load_backbone
from oodeval.features.extract import extract
from oodeval.features.pass_options import parse_pass

KW = {"num_classes": 3, "pretrained_cfg_overlay": {"input_size": (3, 32, 32)}}
EPS32 = float(np.finfo(np.float32).eps)
ALL = ("odin", "gram", "rankfeat", "mcd")


def _folder(root: Path, classes: tuple[str, ...], n: int, seed: int, smooth: bool = False) -> Path:
    rng = np.random.default_rng(seed)
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(n):
            img = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
            if smooth:  # OOD: blocky images, another input distribution
                img = np.kron(rng.integers(0, 256, (4, 4, 3)), np.ones((8, 8, 1))).astype(np.uint8)
            Image.fromarray(img).save(root / c / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """ID train (60 images: the 32-channel layers' covariances are full rank), ID test, OOD, each
    extracted once with every pass (ID train: mds clean and gram; the others: all, mds perturbed
    along ID train's Gaussians)."""
    root = tmp_path_factory.mktemp("net")
    _folder(root / "train", ("a", "b", "c"), 20, 0)
    _folder(root / "test", ("a", "b", "c"), 4, 1)
    _folder(root / "ood", ("x",), 12, 2, smooth=True)
    store = root / "store"
    layers = "layers=act1+layer1"
    opts = dict(model_kwargs=KW, progress=False, batch_size=64)
    train = extract("test_resnet", root / "train", store, passes=[parse_pass("mds", f"noise=0,{layers}"), parse_pass("gram", True)], **opts)
    scored = [parse_pass(k, True) for k in ALL] + [parse_pass("mds", f"noise=0.0014,{layers},fit={train}")]
    out = {"root": root, "store": store, "train": FeatureSet.load(train), "scored": scored, "opts": opts, "paths": {"train": train}}
    for name in ("test", "ood"):
        out["paths"][name] = extract("test_resnet", root / name, store, passes=scored, **opts)
        out[name] = FeatureSet.load(out["paths"][name])
    return out


@pytest.fixture(scope="module")
def test_inputs(sets: dict) -> tuple[torch.nn.Module, torch.Tensor]:
    """The extracted model (the same random init) and the ID-test rows as its input tensor, as the extraction feeds them."""
    bb = load_backbone("test_resnet", model_kwargs=KW)
    model = bb.model.to(memory_format=torch.channels_last)
    paths = Manifest.from_csv(sets["paths"]["test"] / "manifest.csv").paths
    x = torch.stack([bb.transform(Image.open(p).convert("RGB")) for p in paths]).contiguous(memory_format=torch.channels_last)
    return model, x


def test_each_pass_is_extracted_once_and_a_changed_setting_recomputes(sets: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: dict[str, int] = {}
    for cls in (passes_mod.OdinPass, passes_mod.GramPass, passes_mod.RankFeatPass, passes_mod.McdPass, passes_mod.MdsPass):
        real = cls.__call__

        def counting(self, ctx, x, first_row, real=real):
            calls[self.kind] = calls.get(self.kind, 0) + 1
            return real(self, ctx, x, first_row)

        monkeypatch.setattr(cls, "__call__", counting)
    test = sets["test"]
    assert set(test.meta["passes"]) == {"odin", "gram", "rankfeat", "mcd", "mds"}
    assert test.meta["passes"]["odin"] == {"kind": "odin", "temperature": 1000.0, "noise": 0.0014, "std": [0.5, 0.5, 0.5]}
    assert test.meta["passes"]["mds"]["fit"] == sets["train"].meta["content_hash"]
    assert test.meta["passes"]["rankfeat"]["blocks"] == ["layer3", "layer4"]
    again = extract("test_resnet", sets["root"] / "test", sets["store"], passes=sets["scored"], **sets["opts"])
    assert calls == {} and FeatureSet.load(again).meta["key"] == test.meta["key"]  # cached: no pass ran
    changed = {"odin": "T=10,eps=0.0014", "gram": "powers=3", "rankfeat": "blocks=layer4", "mcd": "samples=3"}
    keys = {test.meta["key"]}
    for kind, setting in changed.items():
        path = extract("test_resnet", sets["root"] / "test", sets["store"], passes=[parse_pass(kind, setting)], **sets["opts"])
        fs = FeatureSet.load(path)
        assert calls.pop(kind) == 1 and not calls  # this pass, once (one batch), and no other
        assert fs.meta["key"] not in keys
        keys.add(fs.meta["key"])
    assert FeatureSet.load(path).extras["mcd/probs"].shape == (12, 3)
    # mcd's masks depend on the batches: another batch size is another entry
    other = extract("test_resnet", sets["root"] / "test", sets["store"], passes=[parse_pass("mcd", "samples=3")],
                    **{**sets["opts"], "batch_size": 5})  # fmt: skip
    assert FeatureSet.load(other).meta["key"] not in keys and calls.pop("mcd") == 3


def test_odin_logits_and_score_follow_the_paper(sets: dict, test_inputs: tuple) -> None:
    model, x = test_inputs
    t, eps = 1000.0, 0.0014
    xg = x.clone().requires_grad_(True)
    f = model(xg)
    # -log S_yhat(x; T) summed over the batch (each image's gradient is its own: BatchNorm in eval mode)
    loss = -(torch.log_softmax(f / t, dim=1).gather(1, f.argmax(1, keepdim=True))).sum()
    (g,) = torch.autograd.grad(loss, xg)
    want = model(x - eps * g.sign() / 0.5).detach().double().numpy()  # std 0.5: timm's test_resnet normalisation
    got = sets["test"].extras["odin/logits"]
    # the same float32 operations on the same input: equal but for summation order inside the convolutions
    np.testing.assert_allclose(got, want, rtol=0, atol=64 * EPS32 * np.abs(want).max())
    f64 = np.asarray(got, dtype=np.float64) / t
    msp = 1.0 / np.exp(f64 - f64.max(axis=1, keepdims=True)).sum(axis=1)
    np.testing.assert_allclose(detectors.create("odin").fit().score(sets["test"]), msp, rtol=1e-15, atol=0)


def test_rankfeat_removes_the_rank1_part_and_fuses_as_the_release(sets: dict, test_inputs: tuple) -> None:
    model, x = test_inputs
    with torch.no_grad():
        feat3 = model.layer3(model.layer2(model.layer1(model.maxpool(model.act1(model.bn1(model.conv1(x)))))))
        feat4 = model.layer4(feat3)

        def minus_rank1(t: torch.Tensor) -> torch.Tensor:
            m = t.double().numpy().reshape(t.shape[0], t.shape[1], -1)
            u, s, vh = np.linalg.svd(m, full_matrices=False)
            return torch.from_numpy((m - s[:, :1, None] * u[:, :, :1] @ vh[:, :1, :]).reshape(t.shape)).float()

        want4 = model.forward_head(minus_rank1(feat4)).double().numpy()
        want3 = model.forward_head(model.layer4(minus_rank1(feat3))).double().numpy()
    test = sets["test"]
    for got, want in ((test.extras["rankfeat/layer4"], want4), (test.extras["rankfeat/layer3"], want3)):
        # SVDs of two LAPACKs agree to float64 rounding; the float32 rest of the network adds its own
        np.testing.assert_allclose(got, want, rtol=0, atol=64 * EPS32 * np.abs(want).max())
    fused = (np.asarray(test.extras["rankfeat/layer3"], np.float64) + test.extras["rankfeat/layer4"]) / 2
    m = fused.max(axis=1)
    energy = m + np.log(np.exp(fused - m[:, None]).sum(axis=1))
    np.testing.assert_allclose(detectors.create("rankfeat").fit().score(test), energy, rtol=1e-15, atol=0)


def test_gram_rows_and_deviations_follow_the_paper(sets: dict, test_inputs: tuple) -> None:
    model, x = test_inputs
    with torch.no_grad():
        a1 = model.act1(model.bn1(model.conv1(x)))
        maps = {"act1": a1.clone(), "layer4": model.forward_features(x)}
    test, train = sets["test"], sets["train"]
    for name, fmap in maps.items():
        f = fmap.double().numpy().reshape(fmap.shape[0], fmap.shape[1], -1)
        for p in (1, 2, 10):
            g = np.einsum("bcs,bds->bc", f**p, f**p)
            want = np.sign(g) * np.abs(g) ** (1 / p)
            # stored float32: one rounding of the float64 value (the convolutions' own order aside)
            np.testing.assert_allclose(test.extras[f"gram/{name}"][:, p - 1], want, rtol=64 * EPS32, atol=0)
    det = detectors.create("gram", val_fraction=0.0, assign="label").fit(train)
    pred = np.asarray(test.logits).argmax(1)
    total = np.zeros(len(test))
    for name in det.layers_:
        gt, gx = np.asarray(train.extras[f"gram/{name}"], np.float64), np.asarray(test.extras[f"gram/{name}"], np.float64)
        lo = np.stack([gt[train.labels == c].min(0) for c in range(3)])[pred]
        hi = np.stack([gt[train.labels == c].max(0) for c in range(3)])[pred]
        total += (np.maximum(lo - gx, 0) / np.abs(lo + 1e-6) + np.maximum(gx - hi, 0) / np.abs(hi + 1e-6)).sum(axis=(1, 2))
    f64 = np.asarray(test.logits, np.float64)
    conf = 1.0 / np.exp(f64 - f64.max(1, keepdims=True)).sum(1)
    np.testing.assert_allclose(det.score(test), -total / conf, rtol=1e-12)


def test_network_detectors_refuse_a_set_without_their_pass(sets: dict) -> None:
    train = sets["train"]  # holds mds (clean) and gram only
    plain = FeatureSet.load(extract("test_resnet", sets["root"] / "test", sets["store"], **sets["opts"]))
    for name, option in (("odin", "--odin T=1000,eps=0.0014"), ("rankfeat", "--rankfeat"), ("mc_dropout", "--mcd"),
                         ("gram", "--gram"), ("mahalanobis_ensemble", "--mds")):  # fmt: skip
        det = detectors.create(name).fit(train)
        with pytest.raises(InputError, match=f"needs the .* pass, which 'test' does not hold: extract with {option}"):
            det.score(plain)
    with pytest.raises(InputError, match="holds the odin pass with temperature=1000.0"):
        detectors.create("odin", temperature=10).fit().score(sets["test"])
    with pytest.raises(InputError, match="fits on the clean ID-train features"):
        detectors.create("mds_ensemble").fit(sets["test"])
    other = FeatureSet.load(extract("test_resnet", sets["root"] / "ood", sets["store"],
                                    passes=[parse_pass("mds", "noise=0,layers=act1+layer1")], **sets["opts"]))  # fmt: skip
    with pytest.raises(InputError, match="perturbed along the Gaussians of another ID-train set"):
        detectors.create("mds_ensemble").fit(other).score(sets["test"])
    with pytest.raises(InputError, match="noise > 0 .* give fit="):
        extract("test_resnet", sets["root"] / "ood", sets["store"], passes=[parse_pass("mds", "noise=0.001")], **sets["opts"])
    with pytest.raises(InputError, match="mcd where='model' needs a model with dropout"):
        extract("test_resnet", sets["root"] / "ood", sets["store"], passes=[parse_pass("mcd", "where=model")], **sets["opts"])


def test_score_and_run_take_the_network_methods(sets: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    store, dirs = sets["store"], {k: str(v) for k, v in sets["paths"].items()}
    names = "odin,mds_ensemble,gram,rankfeat,MCD"
    out = tmp_path / "scores.csv"
    assert main(["score", "--train", dirs["train"], "--test", dirs["test"], "--ood", f"ood={dirs['ood']}", "--detectors", names,
                 "--out", str(out), "--format", "csv"]) == 0  # fmt: skip
    import pandas as pd

    table = pd.read_csv(out, comment="#")
    assert sorted(table["detector"]) == sorted(["odin", "mahalanobis_ensemble", "gram", "rankfeat", "mc_dropout"])
    assert table["status"].eq("ok").all()
    exp = tmp_path / "exp.toml"
    exp.write_text(f"""name = "net"
store = "{store}"
results = "{tmp_path / 'r.parquet'}"
bootstrap_draws = 10
[datasets]
id_train = "{sets['root'] / 'train'}"
id_test = "{sets['root'] / 'test'}"
ood = [{{name = "{sets['root'] / 'ood'}", label = "ood"}}]
[[models]]
name = "test_resnet"
pretrained = false
model_kwargs = {{num_classes = 3, pretrained_cfg_overlay = {{input_size = [3, 32, 32]}}}}
odin = true
mds = {{noise = 0.0014, layers = ["act1", "layer1"]}}
gram = true
rankfeat = true
mcd = true
detectors = [{', '.join(f'"{n}"' for n in names.split(','))}]
""")
    from oodeval.experiment import load_config, run_experiment
    from oodeval.results import load_results

    run_experiment(load_config(exp), progress=False)
    rows = load_results(tmp_path / "r.parquet")
    assert rows["status"].eq("ok").all(), rows[["detector", "error"]]
    # the experiment read the very entries extracted above (same keys): its AUROCs are the CLI's
    merged = rows.set_index("detector")["auroc"].sort_index()
    np.testing.assert_allclose(merged.to_numpy(), table.set_index("detector")["auroc"].sort_index().to_numpy(), rtol=1e-12)
