"""NAC per-layer states captured in one forward pass of a random-init timm ``test_resnet``."""

import numpy as np
import pytest
import timm
import torch

from oodeval import detectors
from oodeval.features import FeatureSet
from oodeval.features.taps import default_nac_layers, final_norm_readout, forward_with_nac, nac_roles, nac_states, vit_depth


# float32 conv/linear reductions reorder with batch size and threading; their rounding error is a few
# ulps of the layer's largest value (measured ~9), not of each element, so near-zero entries get an
# absolute tolerance of 64 float32 ulps of the layer's scale.
ULPS = 64 * np.finfo(np.float32).eps


def assert_close_at_layer_scale(got, want):
    scale = float(want.abs().max())
    torch.testing.assert_close(got, want, rtol=1e-4, atol=ULPS * scale)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return timm.create_model("test_resnet", pretrained=False, num_classes=7).eval()


@pytest.fixture(scope="module")
def images():
    return torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def test_default_layers_follow_the_nac_release_for_resnets(model):
    assert default_nac_layers(model) == ["pre_logits", "layer3", "layer2", "layer1"]


def test_states_match_independent_derivations(model, images):
    layers = default_nac_layers(model)
    out = forward_with_nac(model, images, layers)
    widths = {"pre_logits": 96, "layer3": 192, "layer2": 48, "layer1": 32}
    assert {k: tuple(v.shape) for k, v in out.states.items()} == {k: (4, w) for k, w in widths.items()}
    with torch.no_grad():
        ref_logits = model(images)
    torch.testing.assert_close(out.logits, ref_logits)
    # pre_logits: for the linear head, dL/dz = W^T (softmax(f) - 1/C) in closed form
    w = model.get_classifier().weight.detach()
    grad = (torch.softmax(out.logits.double(), 1) - 1 / 7) @ w.double()
    assert_close_at_layer_scale(out.states["pre_logits"].double(), out.features.double() * grad)
    # layer3: retain_grad + backward, then sum-pool output and gradient separately
    kept = {}
    hook = model.layer3.register_forward_hook(lambda m, i, o: kept.setdefault("o", o))
    x = images.clone()
    logits = model(x)
    hook.remove()
    kept["o"].retain_grad()
    (-torch.log_softmax(logits, 1).mean(1).sum()).backward()
    ref = kept["o"].sum((2, 3)) * kept["o"].grad.sum((2, 3))
    model.zero_grad(set_to_none=True)
    assert_close_at_layer_scale(out.states["layer3"], ref.detach())
    assert float(out.states["layer3"].abs().max()) > 0


def test_each_sample_state_is_its_own(model, images):
    _, batch = nac_states(model, images, ["pre_logits", "layer2"])
    _, single = nac_states(model, images[2:3], ["pre_logits", "layer2"])
    for k in batch:
        assert_close_at_layer_scale(batch[k][2:3], single[k])


def test_bad_calls_are_refused(model, images):
    with pytest.raises(ValueError, match="unknown layer"):
        nac_states(model, images, ["layer9"])
    model.train()
    try:
        with pytest.raises(ValueError, match="eval"):
            nac_states(model, images, ["layer1"])
    finally:
        model.eval()


def test_states_feed_the_nac_detector_through_a_saved_featureset(model, tmp_path):
    layers = default_nac_layers(model)
    gen = torch.Generator().manual_seed(2)

    def featureset(n, shift):
        out = forward_with_nac(model, torch.randn(n, 3, 32, 32, generator=gen) + shift, layers)
        extras = {f"nac/{k}": v.numpy() for k, v in out.states.items()}
        labels = out.logits.argmax(1).numpy().astype(np.int64)
        return FeatureSet(out.features.numpy(), labels=labels, logits=out.logits.numpy(), extras=extras)

    featureset(24, 0.0).save(tmp_path / "train")
    train = FeatureSet.load(tmp_path / "train")
    assert sorted(train.extras) == sorted(f"nac/{k}" for k in layers)
    det = detectors.create("nac", n_fit=None).fit(train)
    assert det.layers_ == sorted(layers)
    scores = det.score(featureset(5, 3.0))
    assert scores.shape == (5,) and ((scores >= 0) & (scores <= 1)).all()


def _closed_form_pre_logits_state(features, logits, weight):
    """pre_logits' state z * dL/dz, dL/dz = W^T (softmax(f) - 1/C), in float64."""
    c = logits.shape[1]
    return features.double() * ((torch.softmax(logits.double(), 1) - 1 / c) @ weight.double())


@pytest.mark.parametrize(("name", "kw", "read"), [
    ("test_vit", {}, ("norm", "token", 1)),  # CLS-token readout, as the release's encoder.ln
    ("vit_small_patch16_dinov3", {"depth": 2, "embed_dim": 32, "num_heads": 2}, ("norm", "avg", 5)),  # patch-token mean
])  # fmt: skip
def test_vit_final_norm_is_read_where_the_classifier_reads_it(name, kw, read):
    torch.manual_seed(0)
    vit = timm.create_model(name, pretrained=False, num_classes=5, **kw).eval()
    with torch.no_grad():  # logits of order 1: near-uniform softmax would cancel p - 1/C in float32
        vit.get_classifier().weight.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(5))
    assert final_norm_readout(vit) == read and isinstance(vit.fc_norm, torch.nn.Identity)
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    out = forward_with_nac(vit, x, ["norm", "pre_logits"])
    # the classifier reads the final norm at the CLS token (or the patch-token mean) with nothing in between,
    # so the norm's state is the classifier input's: z * W^T (p - 1/C); a sum over all tokens is not
    want = _closed_form_pre_logits_state(out.features, out.logits, vit.get_classifier().weight.detach())
    assert_close_at_layer_scale(out.states["norm"].double(), want)
    assert_close_at_layer_scale(out.states["pre_logits"].double(), want)


def test_eva_and_xcit_taps_follow_the_vit_recipe_on_their_block_names():
    eva = timm.create_model("eva02_tiny_patch14_224", pretrained=False, num_classes=3, img_size=28, depth=3).eval()
    layers = default_nac_layers(eva)
    assert layers == ["fc_norm", "blocks.2.norm2", "blocks.1.norm2", "blocks.0.norm2"] and vit_depth(eva) == 3
    assert final_norm_readout(eva) is None  # fc_norm runs after pooling: one vector per image, read as is
    assert nac_roles(eva, layers + ["blocks.0.attn"]) == dict(zip(layers, range(4)))
    xcit = timm.create_model("xcit_nano_12_p16_224", pretrained=False, num_classes=3, img_size=32, depth=2).eval()
    assert default_nac_layers(xcit) == ["norm", "cls_attn_blocks.1.norm2", "cls_attn_blocks.0.norm2", "blocks.1.norm2"]
    assert final_norm_readout(xcit) == ("norm", "token", 1) and vit_depth(xcit) == 4
    out = forward_with_nac(xcit, torch.randn(2, 3, 32, 32), default_nac_layers(xcit))
    assert {k: tuple(v.shape) for k, v in out.states.items()} == {k: (2, 128) for k in default_nac_layers(xcit)}


def test_probe_head_states_flow_from_the_probe_logits():
    torch.manual_seed(0)
    backbone = timm.create_model("test_vit", pretrained=False, num_classes=0).eval()  # a frozen backbone: no head
    probe = torch.nn.Linear(backbone.num_features, 4)
    x = torch.randn(3, 3, 160, 160, generator=torch.Generator().manual_seed(4))
    out = forward_with_nac(backbone, x, ["norm", "pre_logits"], probe)
    with torch.no_grad():
        torch.testing.assert_close(out.logits, probe(backbone(x)))
    want = _closed_form_pre_logits_state(out.features, out.logits, probe.weight.detach())
    assert_close_at_layer_scale(out.states["pre_logits"].double(), want)
    assert_close_at_layer_scale(out.states["norm"].double(), want)


def test_extraction_taps_a_backbone_through_its_probe_head(tmp_path):
    from PIL import Image

    from oodeval.features.backbones import save_head
    from oodeval.features.extract import extract

    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (tmp_path / "data" / c).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(tmp_path / "data" / c / f"{i}.png")
    kw = {"num_classes": 0, "pretrained_cfg_overlay": {"input_size": (3, 32, 32)}, "img_size": 32}
    w = rng.normal(size=(4, 64)).astype(np.float32)
    head = save_head(tmp_path / "probe.safetensors", w, np.zeros(4, np.float32))
    fs = FeatureSet.load(extract("test_vit", tmp_path / "data", tmp_path / "store", model_kwargs=kw, head=head, taps=True,
                                 progress=False))
    assert fs.meta["taps"][0] == "norm" and fs.meta["nac_readout"]["norm"] == "CLS token"
    np.testing.assert_allclose(fs.logits, fs.features @ w.T, rtol=1e-5, atol=1e-5)
    want = _closed_form_pre_logits_state(*(torch.tensor(np.array(a)) for a in (fs.features, fs.logits, w)))
    assert_close_at_layer_scale(torch.tensor(np.array(fs.extras["nac/norm"])).double(), want)
