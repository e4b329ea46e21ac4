"""open_clip extraction: normalised embeddings, the GL-MCM value-path patch features, the text tower."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from oodeval.features import FeatureSet
from oodeval.features.backbones import load_backbone, load_open_clip
from oodeval.features.extract import extract
from oodeval.features.valuepath import image_and_patch_features


def _hand_written_patches(visual: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The value path of the last block written out with the raw parameters (GL-MCM / MaskCLIP)."""
    h = visual._embeds(x)
    for block in visual.transformer.resblocks[:-1]:
        h = block(h)
    last = visual.transformer.resblocks[-1]
    assert isinstance(last.ls_1, torch.nn.Identity) and isinstance(last.ls_2, torch.nn.Identity)
    d = h.shape[-1]

    def ln(t: torch.Tensor, m: torch.nn.LayerNorm) -> torch.Tensor:
        mu = t.mean(-1, keepdim=True)
        var = ((t - mu) ** 2).mean(-1, keepdim=True)
        return (t - mu) / torch.sqrt(var + m.eps) * m.weight + m.bias

    w_in, b_in = last.attn.in_proj_weight, last.attn.in_proj_bias
    value = ln(h, last.ln_1) @ w_in[2 * d :].T + b_in[2 * d :]
    u = h + value @ last.attn.out_proj.weight.T + last.attn.out_proj.bias
    hidden = F.gelu(ln(u, last.ln_2) @ last.mlp.c_fc.weight.T + last.mlp.c_fc.bias)
    u = u + hidden @ last.mlp.c_proj.weight.T + last.mlp.c_proj.bias
    tokens = ln(u, visual.ln_post)[:, 1:] @ visual.proj
    return tokens / tokens.norm(dim=-1, keepdim=True)


def test_value_path_equals_hand_written_last_block(tiny_clip: str) -> None:
    bb = load_backbone(f"open_clip:{tiny_clip}")
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        glob, patches = image_and_patch_features(bb.model.visual, x)
        expected = _hand_written_patches(bb.model.visual, x)
        ordinary = bb.model.visual.ln_post(bb.model.visual.transformer(bb.model.visual._embeds(x)))[:, 1:] @ bb.model.visual.proj
        ref = bb.model.encode_image(x, normalize=True)
    assert patches.shape == (3, 16, 32)
    torch.testing.assert_close(patches, expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(glob, ref, rtol=1e-5, atol=1e-6)
    assert (F.normalize(ordinary, dim=-1) - patches).abs().max() > 1e-2  # the attention really was replaced


def test_clip_extraction_with_patch_features_and_saved_weights(tiny_clip: str, tmp_path: Path) -> None:
    import open_clip
    from safetensors.torch import save_file

    rng = np.random.default_rng(2)
    for i in range(5):
        Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
    (tmp_path / "5.png").write_bytes(b"")
    net, _, preprocess = open_clip.create_model_and_transforms(tiny_clip, pretrained=None)
    with torch.no_grad():
        for p in net.visual.parameters():
            p.mul_(1.5)
    weights = tmp_path / "clip.safetensors"
    save_file(net.state_dict(), str(weights))

    path = extract(f"open_clip:{tiny_clip}", tmp_path, tmp_path / "store", weights=weights, patch_features=True, progress=False)
    fs = FeatureSet.load(path)
    assert len(fs) == 5 and fs.meta["n_skipped"] == 1 and fs.logits is None and not fs.has_head
    np.testing.assert_allclose(np.linalg.norm(fs.features, axis=1), 1.0, rtol=1e-5)
    net.eval()
    x = torch.stack([preprocess(Image.open(tmp_path / f"{i}.png")) for i in range(5)])
    with torch.no_grad():
        np.testing.assert_allclose(fs.features, net.encode_image(x, normalize=True).numpy(), rtol=1e-4, atol=1e-5)
        assert fs.extras["patch_features"].dtype == np.float16  # stored in float16: + its unit roundoff 2^-11
        np.testing.assert_allclose(fs.extras["patch_features"], _hand_written_patches(net.visual, x).numpy(), rtol=1e-4 + 2**-11,
                                   atol=1e-5 + 2**-24)
    assert fs.meta["preprocessing"]["library"] == "open_clip" and "Normalize" in fs.meta["preprocessing"]["transform"]

    with pytest.raises(ValueError, match="VLM image towers only"):
        extract("test_resnet", tmp_path, tmp_path / "store", patch_features=True, progress=False)


def test_text_tower_for_zero_shot(tiny_clip: str) -> None:
    model, preprocess, tokenizer = load_open_clip(tiny_clip)
    with torch.no_grad():
        t = model.encode_text(tokenizer(["a photo of a cat", "a dog"]), normalize=True)
    assert t.shape == (2, 32) and torch.allclose(t.norm(dim=-1), torch.ones(2))
    with pytest.raises(ValueError, match="no pretrained tag"):
        load_open_clip(f"{tiny_clip}@laion2b_s34b_b88k")


def test_corrupt_clip_weights_are_a_value_error(tiny_clip: str, tmp_path: Path) -> None:
    from oodeval.features.backbones import load_backbone

    for name, data in (("w.safetensors", b"\x08\x00\x00\x00\x00\x00\x00\x00not json"), ("w.bin", b"not a pickle")):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError, match=f"weights file .*{name} cannot be read"):
            load_backbone(f"open_clip:{tiny_clip}", tmp_path / name)
