"""Logits are the float32 head applied to the stored features, whatever the trunk's autocast."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from oodeval.features import FeatureSet
from oodeval.features.extract import extract

KW = {"num_classes": 3, "pretrained_cfg_overlay": {"input_size": (3, 32, 32)}}
U32 = 2.0**-24  # unit roundoff of float32


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("imgs") / "pets"
    rng = np.random.default_rng(0)
    for c in ("cat", "dog"):
        (root / c).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(rng.integers(0, 256, (36, 40, 3), dtype=np.uint8)).save(root / c / f"{i}.png")
    return root


def _assert_fp32_head(fs: FeatureSet) -> None:
    """|logits - (z W^T + b)| within the float32 dot-product bound gamma_D (|z| |W|^T + |b|), gamma_D = D u / (1 - D u)."""
    z, w, b = (np.asarray(a, dtype=np.float64) for a in (fs.features, fs.weight, fs.bias))
    d = z.shape[1] + 1
    gamma = d * U32 / (1 - d * U32)
    bound = gamma * (np.abs(z) @ np.abs(w).T + np.abs(b))
    err = np.abs(np.asarray(fs.logits, dtype=np.float64) - (z @ w.T + b))
    assert fs.logits.dtype == np.float32
    assert (err <= bound).all(), float((err / bound).max())


@pytest.mark.parametrize("model", ["test_resnet", "test_vit"])
@pytest.mark.parametrize("taps", [False, True])
def test_bf16_trunk_gives_float32_logits_of_the_stored_features(folder: Path, tmp_path: Path, model: str, taps: bool) -> None:
    fp32 = FeatureSet.load(extract(model, folder, tmp_path, model_kwargs=KW, device="cpu", amp=False, taps=taps, progress=False))
    bf16 = FeatureSet.load(extract(model, folder, tmp_path, model_kwargs=KW, device="cpu", amp=True, taps=taps, progress=False))
    assert (fp32.meta["precision"], bf16.meta["precision"]) == ("fp32", "bf16")
    # the trunk really ran in bf16: its features differ from the fp32 pass far beyond float32 rounding
    scale = float(np.abs(fp32.features).max())
    assert float(np.abs(bf16.features - fp32.features).max()) > 1e3 * U32 * scale
    _assert_fp32_head(fp32)
    _assert_fp32_head(bf16)
    # a bf16 value cast to float32 has its 16 low mantissa bits zero; these logits use them
    assert (np.ascontiguousarray(bf16.logits).view(np.uint32) & 0xFFFF).any()


def test_own_module_under_bf16_autocast_gives_float32_head_logits(folder: Path, tmp_path: Path) -> None:
    import torch
    from torchvision import transforms

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                              torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).eval()  # fmt: skip
    tf = transforms.Compose([transforms.Resize((32, 32)), transforms.ToTensor()])
    fp32 = FeatureSet.load(extract(net, folder, tmp_path, transform=tf, device="cpu", amp=False, progress=False))
    bf16 = FeatureSet.load(extract(net, folder, tmp_path, transform=tf, device="cpu", amp=True, progress=False))
    scale = float(np.abs(fp32.features).max())
    assert float(np.abs(bf16.features - fp32.features).max()) > 1e3 * U32 * scale
    _assert_fp32_head(fp32)
    _assert_fp32_head(bf16)
    assert (np.ascontiguousarray(bf16.logits).view(np.uint32) & 0xFFFF).any()
