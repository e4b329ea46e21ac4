"""OpenOOD's networks (``openood:resnet18_32x32``, ``openood:resnet18_224x224``): the release's module
names, its checkpoint layout loaded bit for bit, a mismatched checkpoint refused naming the keys, its
test transforms, and extraction of the 512-d pooled feature and the fc logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from oodeval import cli
from oodeval.errors import InputError, UnknownNameError
from oodeval.features.backbones import load_backbone, parse_model_name
from oodeval.features.openood import PREPROCESSING, ResNet18_32x32, resnet18_224x224

MODEL = "openood:resnet18_32x32"
#: parameter and buffer names of OpenOOD v1.5's openood/networks/resnet18_32x32.py (ResNet18_32x32 with
#: BasicBlock: conv1/bn1, layer1..4 of two blocks with conv1/bn1/conv2/bn2 and a conv+BN ``shortcut``
#: where the shape changes, fc); a few with their shapes for num_classes=10
RELEASE_KEYS = {
    "conv1.weight": (64, 3, 3, 3), "bn1.running_mean": (64,), "bn1.num_batches_tracked": (),
    "layer1.0.conv1.weight": (64, 64, 3, 3), "layer1.1.bn2.bias": (64,),
    "layer2.0.conv1.weight": (128, 64, 3, 3), "layer2.0.shortcut.0.weight": (128, 64, 1, 1),
    "layer2.0.shortcut.1.running_var": (128,), "layer3.0.shortcut.0.weight": (256, 128, 1, 1),
    "layer4.0.shortcut.1.weight": (512,), "layer4.1.conv2.weight": (512, 512, 3, 3),
    "fc.weight": (10, 512), "fc.bias": (10,),
}  # fmt: skip


def _checkpoint(path, num_classes: int = 10, seed: int = 1, network=ResNet18_32x32) -> dict:
    """A random-init network's state dict saved as OpenOOD's recorder saves best.ckpt (torch.save of
    state_dict()); BN statistics set away from their defaults so that a buffer not loaded would show."""
    torch.manual_seed(seed)
    net = network(num_classes=num_classes)
    with torch.no_grad():
        for name, buf in net.named_buffers():
            if name.endswith(("running_mean", "running_var")):
                buf.copy_(torch.rand_like(buf) + 0.5)
            elif name.endswith("num_batches_tracked"):
                buf.fill_(390 * 100)
    sd = net.state_dict()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(sd, path)
    return sd


def test_module_names_and_shapes_are_the_releases():
    sd = ResNet18_32x32().state_dict()
    for key, shape in RELEASE_KEYS.items():
        assert tuple(sd[key].shape) == shape, key
    # 6 stem + 8 blocks x 12 + 3 shortcuts x 6 + 2 fc: no shortcut in layer1 (stride 1, 64 -> 64), no max-pool
    assert len(sd) == 6 + 8 * 12 + 3 * 6 + 2
    assert not any(k.startswith("layer1.0.shortcut") or "maxpool" in k for k in sd)


def test_an_openood_checkpoint_loads_bit_identically_and_extracts_its_feature_and_logits(tmp_path):
    ckpt = tmp_path / "cifar10_resnet18_32x32_base_e100_lr0.1_default" / "s0" / "best.ckpt"
    saved = _checkpoint(ckpt)
    bb = load_backbone(MODEL, ckpt)
    loaded = bb.model.state_dict()
    assert loaded.keys() == saved.keys()
    assert all(torch.equal(loaded[k], saved[k]) and loaded[k].dtype == saved[k].dtype for k in saved)
    assert bb.info["feature_dim"] == 512
    # the release's forward, re-derived: stem, 4 stages, adaptive avg-pool, flatten = feature; fc(feature) = logits
    torch.manual_seed(0)
    x = torch.randn(5, 3, 32, 32)
    net = bb.model
    with torch.no_grad():
        h = torch.relu(net.bn1(net.conv1(x)))
        for layer in (net.layer1, net.layer2, net.layer3, net.layer4):
            h = layer(h)
        feature = h.mean(dim=(2, 3))
        out = bb.forward(x)
    assert out["features"].shape == (5, 512) and out["logits"].shape == (5, 10)
    torch.testing.assert_close(out["features"], feature, rtol=0, atol=1e-5 * float(feature.abs().max()))
    torch.testing.assert_close(out["logits"], feature @ saved["fc.weight"].T + saved["fc.bias"], rtol=0,
                               atol=1e-5 * float(out["logits"].abs().max()))


def test_a_mismatched_checkpoint_is_refused_naming_the_keys(tmp_path, capsys):
    sd = _checkpoint(tmp_path / "ok.ckpt")
    renamed = {("features." + k if k.startswith("layer4.1.") else k): v for k, v in sd.items()}  # 12 tensors; BN fills its 2 num_batches_tracked
    torch.save(renamed, tmp_path / "renamed.ckpt")
    with pytest.raises(InputError, match=r"10 missing keys \(e\.g\. \['layer4\.1\.conv1\.weight'.*12 unexpected keys \(e\.g\. \['features\.layer4\.1"):
        load_backbone(MODEL, tmp_path / "renamed.ckpt")
    _checkpoint(tmp_path / "c100.ckpt", num_classes=100)
    with pytest.raises(InputError, match=r"2 tensors of another shape .*fc\.weight \(100, 512\) \(model \(10, 512\)\)"):
        load_backbone(MODEL, tmp_path / "c100.ckpt")
    assert load_backbone(MODEL, tmp_path / "c100.ckpt", model_kwargs={"benchmark": "cifar100"}).weight.shape == (100, 512)
    img = tmp_path / "img"
    img.mkdir()
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(img / "0.png")
    assert cli.main(["extract", "--model", MODEL, "--weights", str(tmp_path / "renamed.ckpt"), "--dataset", str(img),
                     "--store", str(tmp_path / "s"), "--no-progress", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("oodeval extract: error: weights ") and "missing keys" in err and err.count("\n") == 1


def test_names_hub_weights_and_kwargs_are_checked():
    assert parse_model_name(MODEL) == ("openood", "resnet18_32x32", None)
    with pytest.raises(InputError, match=r"unknown model prefix 'openod:' \(did you mean 'openood:'\?\); known prefixes: timm:, open_clip:, hf:, openood:"):
        parse_model_name("openod:resnet18_32x32")
    with pytest.raises(UnknownNameError, match="unknown OpenOOD network 'resnet50'; known: openood:resnet18_32x32"):
        load_backbone("openood:resnet50")
    with pytest.raises(InputError, match="has no hub weights .*best.ckpt"):
        load_backbone(MODEL, pretrained=True)
    with pytest.raises(InputError, match="benchmark must be one of cifar10, cifar100 .*'imagenet200'"):
        load_backbone(MODEL, model_kwargs={"benchmark": "imagenet200"})
    with pytest.raises(InputError, match="benchmark must be one of cifar10, cifar100"):
        load_backbone(MODEL, model_kwargs={"benchmark": "svhn"})


def test_preprocessing_is_openoods_cifar_test_transform():
    """Resize 32 (bilinear), centre crop 32, ToTensor, the benchmark's mean/std: a 32-px image is only
    normalised, exactly as (x/255 - mean) / std in float32."""
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
    for bench in ("cifar10", "cifar100"):
        tf = load_backbone(MODEL, model_kwargs={"benchmark": bench}).transform
        mean, std = (torch.tensor(v).view(3, 1, 1) for v in PREPROCESSING[bench][2:])
        want = (torch.from_numpy(a).permute(2, 0, 1).float().div(255) - mean) / std
        torch.testing.assert_close(tf(Image.fromarray(a)), want, rtol=0, atol=4 * float(np.finfo(np.float32).eps) * float(want.abs().max()))
    big = tf(Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)))
    assert big.shape == (3, 32, 32)
    assert PREPROCESSING["cifar10"] == (32, 32, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))  # the release's preprocessor.py


#: resnet18_224x224.py subclasses torchvision's ResNet (BasicBlock, [2, 2, 2, 2]): torchvision's names
RELEASE_KEYS_224 = {
    "conv1.weight": (64, 3, 7, 7), "bn1.running_var": (64,), "layer1.0.conv2.weight": (64, 64, 3, 3),
    "layer2.0.downsample.0.weight": (128, 64, 1, 1), "layer2.0.downsample.1.running_mean": (128,),
    "layer4.1.bn2.weight": (512,), "fc.weight": (200, 512), "fc.bias": (200,),
}  # fmt: skip


def test_the_imagenet200_network_loads_its_checkpoint_and_preprocesses_at_224(tmp_path):
    """openood:resnet18_224x224: torchvision's ResNet-18 names, 200 classes for ImageNet-200 (1000 with
    benchmark imagenet), a best.ckpt loaded bit for bit; 256-px resize then 224 centre crop, ImageNet
    mean/std; the 512-d feature and 200 logits of two images."""
    ckpt = tmp_path / "imagenet200_resnet18_224x224_base_e90_lr0.1_default" / "s0" / "best.ckpt"
    saved = _checkpoint(ckpt, num_classes=200, network=resnet18_224x224)
    for key, shape in RELEASE_KEYS_224.items():
        assert tuple(saved[key].shape) == shape, key
    assert len(saved) == 6 + 8 * 12 + 3 * 6 + 2 and not any("shortcut" in k for k in saved)
    bb = load_backbone("openood:resnet18_224x224", ckpt)
    loaded = bb.model.state_dict()
    assert loaded.keys() == saved.keys() and all(torch.equal(loaded[k], saved[k]) for k in saved)
    assert load_backbone("openood:resnet18_224x224", model_kwargs={"benchmark": "imagenet"}).weight.shape == (1000, 512)
    rng = np.random.default_rng(1)
    img = Image.fromarray(rng.integers(0, 256, (300, 260, 3), dtype=np.uint8))
    x = bb.transform(img)
    assert x.shape == (3, 224, 224)
    from torchvision.transforms import functional as TF

    resized = TF.center_crop(TF.resize(img, 256, interpolation=TF.InterpolationMode.BILINEAR), 224)
    mean, std = (torch.tensor(v).view(3, 1, 1) for v in PREPROCESSING["imagenet200"][2:])
    torch.testing.assert_close(x, (TF.to_tensor(resized) - mean) / std, rtol=0, atol=0)
    with torch.no_grad():
        out = bb.forward(torch.stack([x, x.flip(-1)]))
        want = bb.model(torch.stack([x, x.flip(-1)]))
    assert out["features"].shape == (2, 512) and out["logits"].shape == (2, 200)
    torch.testing.assert_close(out["logits"], want, rtol=0, atol=1e-5 * float(want.abs().max()))
