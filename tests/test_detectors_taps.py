"""NAC per-layer states captured in one forward pass of a random-init timm ``test_resnet``."""

import numpy as np
import pytest
import timm
import torch

from oodeval import detectors
from oodeval.features import FeatureSet
from oodeval.features.taps import default_nac_layers, forward_with_nac, nac_states


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
