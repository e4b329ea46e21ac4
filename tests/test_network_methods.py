"""The methods that need the network (ODIN, Mahalanobis with preprocessing and its layer ensemble,
Gram, RankFeat, MC dropout): their extraction passes, caching, CLI and experiment runs, each
re-derived from its paper's formula on a tiny random-init ResNet, and against pytorch-ood."""

from __future__ import annotations

import re
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

SIZE = 48  # block 4 of test_resnet is then 2 x 2 (1 x 1 at 32 px: its own rank-1 part)
KW = {"num_classes": 3, "pretrained_cfg_overlay": {"input_size": (3, SIZE, SIZE)}}
EPS32 = float(np.finfo(np.float32).eps)
ALL = ("odin", "gram", "rankfeat", "mcd")


def _folder(root: Path, classes: tuple[str, ...], n: int, seed: int, smooth: bool = False) -> Path:
    rng = np.random.default_rng(seed)
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(n):
            img = rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
            if smooth:  # OOD: blocky images, another input distribution
                img = np.kron(rng.integers(0, 256, (4, 4, 3)), np.ones((SIZE // 4, SIZE // 4, 1))).astype(np.uint8)
            Image.fromarray(img).save(root / c / f"{i}.png")
    return root


def _lively_weights(path: Path) -> Path:
    """timm's random init of test_resnet zero-initialises each block's last BatchNorm and gives a
    small head, so its logits barely move with the input; seeded random BatchNorm affines (positive
    scales and shifts: no channel dead after its ReLU, so each layer's covariance is full rank) and
    a head 20x larger make every method's scores spread (a weights file, so extraction reads the same)."""
    from safetensors.torch import save_file

    net = load_backbone("test_resnet", model_kwargs=KW).model
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for mod in net.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.weight.copy_(1 + 0.3 * torch.randn(mod.weight.shape, generator=gen).abs())
                mod.bias.copy_(0.5 + 0.2 * torch.randn(mod.bias.shape, generator=gen))  # no channel dead after its ReLU
        net.fc.weight.mul_(20)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(path))
    return path


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
    weights = _lively_weights(root / "weights.safetensors")
    opts = dict(model_kwargs=KW, weights=weights, progress=False, batch_size=64)
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
    bb = load_backbone("test_resnet", sets["opts"]["weights"], model_kwargs=KW)
    model = bb.model.to(memory_format=torch.channels_last)
    paths = Manifest.from_csv(sets["paths"]["test"] / "manifest.csv").paths
    x = torch.stack([bb.transform(Image.open(p).convert("RGB")) for p in paths]).contiguous(memory_format=torch.channels_last)
    return model, x


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the batches each network pass runs on."""
    seen: dict[str, int] = {}
    for cls in (passes_mod.OdinPass, passes_mod.GramPass, passes_mod.RankFeatPass, passes_mod.McdPass, passes_mod.MdsPass):
        real = cls.__call__

        def counting(self, ctx, x, first_row, real=real):
            seen[self.kind] = seen.get(self.kind, 0) + 1
            return real(self, ctx, x, first_row)

        monkeypatch.setattr(cls, "__call__", counting)
    return seen


def test_each_pass_is_extracted_once_and_a_changed_setting_recomputes(sets: dict, calls: dict) -> None:
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


def test_an_interrupted_pass_resumes_to_the_same_arrays(sets: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from oodeval.features import store as store_mod

    specs = [parse_pass("odin", True), parse_pass("rankfeat", True), parse_pass("mcd", "samples=3")]
    opts = {**sets["opts"], "batch_size": 4, "shard_size": 4}
    real, written = store_mod.write_shard, []

    def write_then_stop(path, *a, **k):
        real(path, *a, **k)
        written.append(path.name)
        if len(written) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(store_mod, "write_shard", write_then_stop)
    with pytest.raises(KeyboardInterrupt):
        extract("test_resnet", sets["root"] / "test", tmp_path / "store", passes=specs, **opts)
    monkeypatch.setattr(store_mod, "write_shard", lambda path, *a, **k: (written.append(path.name), real(path, *a, **k)))
    resumed = FeatureSet.load(extract("test_resnet", sets["root"] / "test", tmp_path / "store", passes=specs, **opts))
    assert written == ["shard-000000.npz", "shard-000001.npz", "shard-000002.npz"]  # 12 rows, 4 per shard: only the third anew
    fresh = FeatureSet.load(extract("test_resnet", sets["root"] / "test", tmp_path / "fresh", passes=specs, **opts))
    assert resumed.meta["passes"] == fresh.meta["passes"]
    for key in ("odin/logits", "rankfeat/layer3", "rankfeat/layer4", "mcd/probs", "mcd/var"):
        np.testing.assert_array_equal(resumed.extras[key], fresh.extras[key])  # the same batches, the same masks


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


def test_gram_normalises_by_the_held_out_rows_deviation(sets: dict) -> None:
    train = sets["train"]
    det = detectors.create("gram", val_fraction=0.5, seed=1).fit(train)
    pred = np.asarray(train.logits).argmax(1)
    held = det.val_rows_
    for c in np.unique(pred):  # int(0.5 n_c) of each predicted class held out
        assert np.isin(held, np.flatnonzero(pred == c)).sum() == int(0.5 * (pred == c).sum())
    kept = np.setdiff1d(np.arange(len(train)), held)
    f64 = np.asarray(train.logits, np.float64)[held]
    conf = 1.0 / np.exp(f64 - f64.max(1, keepdims=True)).sum(1)
    for i, name in enumerate(det.layers_):
        g = np.asarray(train.extras[f"gram/{name}"], np.float64)
        lo, hi = np.full_like(det.mins_[name], np.nan), np.full_like(det.maxs_[name], np.nan)
        for c in np.unique(pred[kept]):  # a class no row is predicted into has no bounds (NaN)
            lo[c], hi[c] = g[kept][pred[kept] == c].min(0), g[kept][pred[kept] == c].max(0)
        np.testing.assert_array_equal(det.mins_[name], lo)
        np.testing.assert_array_equal(det.maxs_[name], hi)
        gh, lh, hh = g[held], lo[pred[held]], hi[pred[held]]
        dev = (np.maximum(lh - gh, 0) / np.abs(lh + 1e-6) + np.maximum(gh - hh, 0) / np.abs(hh + 1e-6)).sum(axis=(1, 2)) / conf
        assert det.norms_[i] == pytest.approx(dev.mean() if dev.mean() > 0 else 1.0, rel=1e-12)


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


def test_score_and_run_take_the_network_methods(sets: dict, tmp_path: Path, calls: dict) -> None:
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
batch_size = 64
[datasets]
id_train = "{sets['root'] / 'train'}"
id_test = "{sets['root'] / 'test'}"
ood = [{{name = "{sets['root'] / 'ood'}", label = "ood"}}]
[[models]]
name = "test_resnet"
weights = "{sets['opts']['weights']}"
model_kwargs = {{num_classes = 3, pretrained_cfg_overlay = {{input_size = [3, 48, 48]}}}}
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
    assert calls == {}  # every set came from the store: the entries extracted above
    rows = load_results(tmp_path / "r.parquet")
    assert rows["status"].eq("ok").all(), rows[["detector", "error"]]
    # the experiment read the very entries extracted above (same keys): its AUROCs are the CLI's
    merged = rows.set_index("detector")["auroc"].sort_index()
    np.testing.assert_allclose(merged.to_numpy(), table.set_index("detector")["auroc"].sort_index().to_numpy(), rtol=1e-12)


# ---------------------------------------------------------------- against pytorch-ood 0.4 (outlier scores: negated)
def _pood():
    import pytorch_ood.detector as pood

    return pood


def _report(name: str, ours: np.ndarray, theirs) -> float:
    rho = spearmanr(ours, -np.asarray(theirs, dtype=np.float64)).statistic
    print(f"{name}: Spearman {rho:.6f}")
    return rho


def test_odin_equals_pytorch_ood(sets: dict, test_inputs: tuple) -> None:
    model, x = test_inputs
    theirs = _pood().ODIN(model, eps=0.0014, temperature=1000.0, norm_std=[0.5, 0.5, 0.5]).predict(x).double().numpy()
    ours = detectors.create("ODIN").fit().score(sets["test"])
    assert _report("ODIN", ours, theirs) == pytest.approx(1.0)
    # the same formula on the same perturbed logits; theirs is a float32 softmax (values <= 1: a few ulps of 1)
    np.testing.assert_allclose(ours, -theirs, rtol=0, atol=8 * EPS32)


def test_mc_dropout_equals_pytorch_ood_and_openood(sets: dict, test_inputs: tuple) -> None:
    model, x = test_inputs
    # OpenOOD's dropout (p on the classifier's input): the pass's masks, drawn after manual_seed(seed + first row)
    with torch.no_grad():
        z = model.forward_head(model.forward_features(x), pre_logits=True)
        torch.manual_seed(0)
        draws = [model.get_classifier()(F.dropout(z, 0.5, training=True)) for _ in range(5)]
    probs = torch.stack([d.softmax(1) for d in draws]).mean(0).double().numpy()
    mean_logits = torch.stack(draws).mean(0).double()
    test = sets["test"]
    np.testing.assert_allclose(test.extras["mcd/probs"], probs, rtol=0, atol=8 * EPS32)
    np.testing.assert_allclose(detectors.create("mc_dropout").fit().score(test), probs.max(1), rtol=0, atol=8 * EPS32)
    openood = mean_logits.softmax(1).max(1).values.numpy()
    np.testing.assert_allclose(detectors.create("dropout", mode="logits").fit().score(test), openood, rtol=0, atol=8 * EPS32)
    # pytorch-ood's MCD: the model's own dropout (timm drop_rate) in train mode, BatchNorm in eval mode
    kw = {**KW, "drop_rate": 0.5}
    path = extract("test_resnet", sets["root"] / "test", sets["store"], passes=[parse_pass("mcd", "where=model,samples=4,seed=3")],
                   **{**sets["opts"], "model_kwargs": kw})  # fmt: skip
    fs = FeatureSet.load(path)
    net = load_backbone("test_resnet", sets["opts"]["weights"], model_kwargs=kw).model.to(memory_format=torch.channels_last)
    torch.manual_seed(3)
    mean, var = _pood().MCD.run(net, x, 4)
    assert not net.training  # put back in eval mode
    ours_mean = detectors.create("MCD", mode="mean").fit().score(fs)
    ours_var = detectors.create("MCD", mode="var").fit().score(fs)
    assert _report("MCD mean", ours_mean, -mean.numpy()) == pytest.approx(1.0)
    assert _report("MCD var", ours_var, var.numpy()) == pytest.approx(1.0)
    np.testing.assert_allclose(ours_mean, mean.double().numpy(), rtol=0, atol=8 * EPS32)
    np.testing.assert_allclose(-ours_var, var.double().numpy(), rtol=16 * EPS32, atol=0)


def test_mahalanobis_preprocessing_agrees_with_pytorch_ood(sets: dict, test_inputs: tuple) -> None:
    model, x = test_inputs

    def encoder(t: torch.Tensor) -> torch.Tensor:  # the spatial mean of act1, the pass's first layer
        return model.act1(model.bn1(model.conv1(t))).mean(dim=(2, 3))

    train, test = sets["train"], sets["test"]
    peer = _pood().MahalanobisODIN(encoder, eps=0.0014, norm_std=[0.5, 0.5, 0.5])
    peer.fit_features(torch.from_numpy(np.array(train.extras["mds/act1"])), torch.from_numpy(np.array(train.labels)))
    det = detectors.create("mds_ensemble", layers=["act1"]).fit(train)
    ridged = peer.predict(x).double().numpy()
    # pytorch-ood inverts the unnormalised scatter plus a ridge of 1e-6 (docs/detectors.md); with
    # the scatter's exact inverse it computes our formula: half the squared distance, times 1 / N
    n = len(train)
    peer._base.precision = torch.from_numpy(np.linalg.inv(n * det.gaussians_["act1"].covariance_)).float()
    theirs = peer.predict(x).double().numpy()
    ours = det.score(test)
    assert _report("MahalanobisODIN (act1, their ridge)", ours, ridged) > 0.99
    assert _report("MahalanobisODIN (act1)", ours, theirs) == pytest.approx(1.0)
    # float32 distances of a covariance of condition ~5e3 against our float64 whitened ones
    np.testing.assert_allclose(ours, -2 * n * theirs, rtol=1e-4)


def test_gram_agrees_with_pytorch_ood(sets: dict, test_inputs: tuple) -> None:
    model, x = test_inputs
    nn = torch.nn
    stages = [nn.Sequential(model.conv1, model.bn1, model.act1), nn.Sequential(model.maxpool, model.layer1), model.layer2,
              model.layer3, model.layer4]  # fmt: skip
    peer = _pood().Gram(head=nn.Sequential(model.global_pool, model.fc), feature_layers=stages, num_classes=3,
                        num_poles_list=list(range(1, 11)))  # fmt: skip
    peer.validation_fraction = 0.0  # both then bound by every ID-train row of a class, normalised by 1
    bb = load_backbone("test_resnet", sets["opts"]["weights"], model_kwargs=KW)
    train = sets["train"]
    paths = Manifest.from_csv(sets["paths"]["train"] / "manifest.csv").paths
    xt = torch.stack([bb.transform(Image.open(p).convert("RGB")) for p in paths]).contiguous(memory_format=torch.channels_last)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xt, torch.from_numpy(np.array(train.labels))), batch_size=64)
    peer.fit(data)
    both = torch.cat([x, _inputs(sets, "ood", bb)])
    theirs = peer.predict(both).double().numpy()
    det = detectors.create("Gram", val_fraction=0.0, assign="label", by_confidence=False).fit(train)
    ours = np.concatenate([det.score(sets["test"]), det.score(sets["ood"])])
    assert _report("Gram", ours, theirs) > 0.999


def _inputs(sets: dict, name: str, bb) -> torch.Tensor:
    paths = Manifest.from_csv(sets["paths"][name] / "manifest.csv").paths
    return torch.stack([bb.transform(Image.open(p).convert("RGB")) for p in paths]).contiguous(memory_format=torch.channels_last)


def test_rankfeat_agrees_with_pytorch_ood(sets: dict, test_inputs: tuple) -> None:
    model, x = test_inputs
    theirs = _pood().RankFeat(backbone=model.forward_features, head=model.forward_head).predict(x).double().numpy()
    ours = detectors.create("RankFeat", blocks=["layer4"]).fit().score(sets["test"])
    assert _report("RankFeat (block 4)", ours, theirs) > 0.999
    # theirs removes the rank-1 part by a float32 SVD, ours by a float64 one
    np.testing.assert_allclose(ours, -theirs, rtol=1e-4)


def test_bad_pass_settings_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    base = ["extract", "--model", "test_resnet", "--pretrained", "none", "--dataset", str(tmp_path), "--store", str(tmp_path / "s")]
    for option, message in ((["--odin", "T=abc"], "--odin: temperature='abc' is not a number"),
                            (["--mcd", "samples=1"], "mcd: samples must be an integer >= 2"),
                            (["--gram", "power=3"], "gram has no setting(s) power; it takes: powers, layers")):  # fmt: skip
        assert main([*base, *option]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("oodeval extract: error: ") and message in err[-1], err
    from oodeval.experiment import load_config

    exp = tmp_path / "exp.toml"
    head = f'name = "x"\nstore = "s"\nresults = "r.parquet"\n[datasets]\nid_test = "{tmp_path}"\nood = ["{tmp_path}"]\n'
    for table, message in (("odin = {temp = 3}", "odin has no setting(s) temp; it takes: temperature, noise, std"),
                           ('mds = {fit = "x"}', "mds: fit is the experiment's id_train set"),
                           ("rankfeat = 3", "rankfeat must be true, a table of settings")):  # fmt: skip
        exp.write_text(head + f'[[models]]\nname = "test_resnet"\npretrained = false\n{table}\n')
        with pytest.raises(InputError, match=re.escape(f"experiment file: [[models]] #1: {message}")):
            load_config(exp)


def test_mahalanobis_ensemble_weights_layers_as_given_or_fitted(sets: dict) -> None:
    from oodeval.detectors.network import fit_layer_weights

    train, test, ood = sets["train"], sets["test"], sets["ood"]
    det = detectors.create("mds_ensemble").fit(train)
    s_id, s_ood = det.layer_scores(test), det.layer_scores(ood)
    assert s_id.shape == (12, 2) and list(det.gaussians_) == ["act1", "layer1"]
    np.testing.assert_allclose(det.score(test), s_id.sum(axis=1), rtol=1e-12)  # weights 1 by default
    w = fit_layer_weights(s_id, s_ood)  # the paper's logistic regression on validation ID vs OOD layer scores
    assert len(w) == 2 and all(np.isfinite(w))
    np.testing.assert_allclose(detectors.create("mds_ensemble", weights=w).fit(train).score(test), s_id @ np.asarray(w), rtol=1e-12)
    one = detectors.create("mds_ensemble", layers=["layer1"]).fit(train)
    np.testing.assert_allclose(one.score(test), s_id[:, 1], rtol=1e-12)
    with pytest.raises(InputError, match="1 weights for 2 layers"):
        detectors.create("mds_ensemble", weights=[1.0]).fit(train)


def test_rankfeat_power_iteration_converges_to_the_svd() -> None:
    gen = torch.Generator().manual_seed(0)
    u, v = torch.randn(2, 8, 1, generator=gen, dtype=torch.float64), torch.randn(2, 1, 9, generator=gen, dtype=torch.float64)
    t = (3 * u @ v + 0.1 * torch.randn(2, 8, 9, generator=gen, dtype=torch.float64)).reshape(2, 8, 3, 3).float()
    s = torch.linalg.svdvals(t.double().reshape(2, 8, 9))
    ratio = float((s[:, 1] / s[:, 0]).max())
    k = int(np.ceil(np.log(1e-12) / (2 * np.log(ratio))))  # the angle to u_1, v_1 shrinks by (s2 / s1)^2 per step: k steps reach 1e-12
    exact = passes_mod.remove_rank1(t)
    powered = passes_mod.remove_rank1(t, iterations=k)
    # both in float64, rounded to float32 at the end: equal to a float32 rounding of the map's scale
    np.testing.assert_allclose(powered.numpy(), exact.numpy(), rtol=0, atol=4 * EPS32 * float(t.abs().max()))
    few = passes_mod.remove_rank1(t, iterations=1)
    assert not np.allclose(few.numpy(), exact.numpy(), rtol=0, atol=4 * EPS32 * float(t.abs().max()))  # one step is not there yet


def test_your_own_module_gets_the_passes_with_its_transforms_std(sets: dict, tmp_path: Path) -> None:
    from torchvision import transforms as T

    nn = torch.nn
    torch.manual_seed(0)

    class Net(nn.Module):  # OpenOOD's ResNet18_32x32 layout: layer1..layer4, then a Linear head
        def __init__(self) -> None:
            super().__init__()
            self.layer1, self.layer2 = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()), nn.Sequential(nn.Conv2d(8, 8, 3, 2, 1), nn.ReLU())
            self.layer3, self.layer4 = nn.Sequential(nn.Conv2d(8, 8, 3, 2, 1), nn.ReLU()), nn.Sequential(nn.Conv2d(8, 8, 3, 2, 1), nn.ReLU())
            self.fc = nn.Linear(8, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.layer4(self.layer3(self.layer2(self.layer1(x)))).mean((2, 3)))

    net = Net()
    tf = T.Compose([T.Resize((32, 32)), T.ToTensor(), T.Normalize([0.5] * 3, [0.25, 0.2, 0.3])])
    fs = FeatureSet.load(extract(net, sets["root"] / "test", tmp_path, transform=tf, progress=False,
                                 passes=[parse_pass("odin", True), parse_pass("gram", "powers=2"), parse_pass("rankfeat", True)]))  # fmt: skip
    # eps in pixel units: the std of the transform's Normalize (as the float32 it normalises with)
    assert fs.meta["passes"]["odin"]["std"] == pytest.approx([0.25, 0.2, 0.3], rel=EPS32)
    assert fs.meta["passes"]["gram"]["layers"] == ["layer1", "layer2", "layer3", "layer4"]
    assert fs.meta["passes"]["rankfeat"]["blocks"] == ["layer3", "layer4"]
    x = torch.stack([tf(Image.open(p).convert("RGB")) for p in Manifest.from_csv(next(tmp_path.glob("*/test-*")) / "manifest.csv").paths])
    xg = x.clone().requires_grad_(True)
    f = net(xg)
    (g,) = torch.autograd.grad(F.cross_entropy(f / 1000, f.argmax(1), reduction="sum"), xg)
    want = net(x - 0.0014 * g.sign() / torch.tensor([0.25, 0.2, 0.3]).view(1, 3, 1, 1)).detach().numpy()
    np.testing.assert_allclose(fs.extras["odin/logits"], want, rtol=0, atol=64 * EPS32 * np.abs(want).max())
