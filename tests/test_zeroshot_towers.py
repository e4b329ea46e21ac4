"""GL-MCM's value path on the paper's non-CLIP towers (issue 14 item 3), each against a hand-written last block.

Tiny random-init versions of the real architectures: the timm factories of SigLIP-SO400M,
SigLIP2-g and PE-Core-L/14 with small widths (registered under oodeval_tiny_*), wrapped by
open_clip's TimmModel as the real open_clip configs do, and a tiny transformers AIMv2 saved to
tmp_path with its tokenizer and image processor (no hub).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from oodeval.features import FeatureSet
from oodeval.features.backbones import load_backbone
from oodeval.features.extract import extract
from oodeval.features.valuepath import image_and_patch_features

#: unit-norm float32 outputs after a few layers: 64 ulps of 1
TOL = 64 * float(np.finfo(np.float32).eps)

TINY = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=4)


@pytest.fixture(scope="module")
def timm_towers(tmp_path_factory) -> dict[str, str]:
    """open_clip configs of tiny SigLIP-SO400M / SigLIP2-g / PE-Core-L towers (timm trunks), by name."""
    import open_clip
    from timm.models import eva, register_model, vision_transformer as vt

    factories = {
        "so400m": lambda **kw: vt.vit_so400m_patch14_siglip_384(**{**TINY, **kw}),
        "gopt": lambda **kw: vt.vit_giantopt_patch16_siglip_384(**{**TINY, **kw}),
        "pecore": lambda **kw: eva.vit_pe_core_large_patch14_336(**{**TINY, "ref_feat_shape": (4, 4), "attn_pool_num_heads": 4, **kw}),
    }
    names = {}
    folder = tmp_path_factory.mktemp("towers")
    for key, make in factories.items():
        timm_name = f"oodeval_tiny_{key}"

        def factory(pretrained: bool = False, _make=make, **kw):
            return _make(pretrained=False, **kw)

        factory.__name__ = timm_name
        register_model(factory)
        proj = None if key == "pecore" else "none"  # PE-Core: the trunk's own Linear head projects (open_clip config)
        cfg = {"embed_dim": 40 if key == "pecore" else 48, "custom_text": True,
               "vision_cfg": {"image_size": 32, "timm_model_name": timm_name, "timm_model_pretrained": False,
                              "timm_pool": "map", "timm_proj": proj},
               "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1,
                            "no_causal_mask": True, "pool_type": "last", "proj_bias": True}}
        path = folder / f"oodeval-tiny-{key}.json"
        path.write_text(json.dumps(cfg))
        open_clip.add_model_config(path)
        names[key] = path.stem
    return names


def _value(linear: torch.nn.Linear, x: torch.Tensor, part: int, parts: int) -> torch.Tensor:
    """The ``part``-th of ``parts`` equal output blocks of a fused projection (q|k|v or k|v)."""
    c = linear.weight.shape[0] // parts
    w = linear.weight[part * c : (part + 1) * c]
    b = None if linear.bias is None else linear.bias[part * c : (part + 1) * c]
    return F.linear(x, w, b)


def _hand_timm(visual, x: torch.Tensor) -> torch.Tensor:
    """Last block with attention = its value branch, then each patch token through the MAP head alone."""
    t = visual.trunk
    h = t.patch_embed(x)
    pos = t._pos_embed(h)
    h, rope = pos if isinstance(pos, tuple) else (pos, None)
    h = t.norm_pre(h)
    kw = {} if rope is None else {"rope": rope}
    for block in t.blocks[:-1]:
        h = block(h, **kw)
    last, attn = t.blocks[-1], t.blocks[-1].attn
    z = last.norm1(h)
    v = _value(attn.qkv, z, 2, 3) if attn.qkv is not None else attn.v_proj(z)
    a = attn.proj(attn.norm(v))
    if hasattr(last, "ls1"):
        u = h + last.ls1(a)
        u = u + last.ls2(last.mlp(last.norm2(u)))
    else:  # EVA block
        u = h + (a if last.gamma_1 is None else last.gamma_1 * a)
        m = last.mlp(last.norm2(u))
        u = u + (m if last.gamma_2 is None else last.gamma_2 * m)
    tokens = t.norm(u)[:, t.num_prefix_tokens :]
    pool = t.attn_pool
    o = pool.proj(_value(pool.kv, tokens, 1, 2))
    o = o + pool.mlp(pool.norm(o))
    o = visual.head(t.head(t.fc_norm(o)))
    return o / o.norm(dim=-1, keepdim=True)


@pytest.mark.parametrize("key", ["so400m", "gopt", "pecore"])
def test_timm_tower_value_path_equals_hand_written(timm_towers: dict, key: str) -> None:
    bb = load_backbone(f"open_clip:{timm_towers[key]}")
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        glob, patches = image_and_patch_features(bb.model, x)
        ref = _hand_timm(bb.model.visual, x)
        emb = bb.model.encode_image(x, normalize=True)
    assert patches.shape == (2, 16, emb.shape[1])
    torch.testing.assert_close(patches, ref, rtol=0, atol=TOL)
    torch.testing.assert_close(glob, emb, rtol=0, atol=TOL)


# --- AIMv2 through transformers ---------------------------------------------------------------

WORDS = ["a", "photo", "of", "the", "cat", "dog", "bad", "many", "large", "small", "cropped", "close-up", "."]


@pytest.fixture(scope="module")
def aimv2_dir(tmp_path_factory) -> Path:
    """A tiny random AIMv2 (LiT) saved with a word-level tokenizer and a CLIP image processor."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import Aimv2Config, Aimv2Model, CLIPImageProcessor, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("aimv2")
    vocab = {w: i for i, w in enumerate(["<pad>", "<unk>", "</s>", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="</s>").save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(folder)
    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    cfg = Aimv2Config(vision_config={**small, "image_size": 32, "patch_size": 8},
                      text_config={**small, "vocab_size": len(vocab), "max_position_embeddings": 16, "eos_token_id": 2},
                      projection_dim=24)
    torch.manual_seed(3)
    Aimv2Model(cfg).eval().save_pretrained(folder)
    return folder


def _hand_aimv2(m, x: torch.Tensor) -> torch.Tensor:
    vm = m.vision_model
    h = vm.embeddings(x)
    for layer in vm.encoder.layers[:-1]:
        h = layer(h)
    last = vm.encoder.layers[-1]
    u = h + last.attention.out_proj(last.attention.v_proj(last.rms_norm1(h)))
    u = u + last.ffn(last.rms_norm2(u))
    o = m.visual_projection(vm.head.output_proj(vm.head.v_proj(vm.rms_norm(u))))
    return o / o.norm(dim=-1, keepdim=True)


def test_aimv2_loads_from_saved_weights_and_value_path_equals_hand_written(aimv2_dir: Path) -> None:
    from transformers import Aimv2Model

    ref_model = Aimv2Model.from_pretrained(aimv2_dir).eval()
    bb = load_backbone(f"hf:{aimv2_dir}", pretrained=True)
    bb_file = load_backbone(f"hf:{aimv2_dir}", weights=aimv2_dir / "model.safetensors")
    random = load_backbone(f"hf:{aimv2_dir}")
    for name, p in ref_model.state_dict().items():
        assert torch.equal(bb.model.hf.state_dict()[name], p) and torch.equal(bb_file.model.hf.state_dict()[name], p)
    assert bb.info["text_tower"] == bb_file.info["text_tower"] != random.info["text_tower"]
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        glob, patches = image_and_patch_features(bb.model, x)
        emb = F.normalize(ref_model.get_image_features(pixel_values=x).pooler_output, dim=-1)
        ref = _hand_aimv2(ref_model, x)
    assert patches.shape == (2, 16, 24)
    torch.testing.assert_close(patches, ref, rtol=0, atol=TOL)
    torch.testing.assert_close(glob, emb, rtol=0, atol=TOL)
    torch.testing.assert_close(bb.features(x), emb, rtol=0, atol=TOL)


def test_aimv2_extraction_text_side_and_every_scorer(aimv2_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer, Aimv2Model

    from oodeval.zeroshot import score_zeroshot, scorer_names
    from oodeval.zeroshot.text import encode_labels

    rng = np.random.default_rng(4)
    for i in range(4):
        Image.fromarray(rng.integers(0, 256, (40, 36, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
    model = f"hf:{aimv2_dir}"
    fs = FeatureSet.load(extract(model, tmp_path, tmp_path / "store", pretrained=True, patch_features=True, progress=False))
    assert fs.extras["patch_features"].shape == (4, 16, 24) and fs.meta["preprocessing"]["library"] == "transformers"
    assert fs.meta["text_tower"] == load_backbone(model, pretrained=True).info["text_tower"]

    labels = ["cat", "dog", "small dog"]
    text = encode_labels(model, labels, pretrained="local", templates=("a photo of a {}.",), progress=False)
    hf, tok = Aimv2Model.from_pretrained(aimv2_dir).eval(), AutoTokenizer.from_pretrained(aimv2_dir)
    batch = tok([f"a photo of a {w}." for w in labels], padding=True, return_tensors="pt")
    with torch.no_grad():
        ref = F.normalize(hf.get_text_features(**batch).pooler_output, dim=-1).numpy()
    np.testing.assert_allclose(text, ref, rtol=0, atol=TOL)

    negatives = encode_labels(model, ["the large cat", "many dog"], pretrained="local", templates=("a photo of a {}.",), progress=False)
    for name in scorer_names():
        neg = negatives if name in ("neglabel", "eoe") else None
        scores = score_zeroshot(name, fs, text.astype(np.float64), neg)
        assert scores.shape == (4,) and np.isfinite(scores).all()


# --- GL-MCM from the patch readout (issue 32) -------------------------------------------------


@pytest.mark.parametrize("family", ["open_clip_vit", "so400m", "gopt", "pecore", "aimv2"])
def test_gl_mcm_from_the_readout_equals_gl_mcm_from_the_full_patch_tensor(family: str, tiny_clip: str, timm_towers: dict,
                                                                          aimv2_dir: Path) -> None:
    """The float64 readout computed at extraction gives the scores of the full (N, P, E) tensor to 1e-12."""
    from oodeval.features.patchreadout import PatchReadout, local_mcm
    from oodeval.zeroshot.scorers import GLMCM

    name = {"open_clip_vit": f"open_clip:{tiny_clip}", "aimv2": f"hf:{aimv2_dir}"}.get(family, f"open_clip:{timm_towers.get(family)}")
    bb = load_backbone(name, pretrained=family == "aimv2")
    x = torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        glob, patches = image_and_patch_features(bb.model, x)
    rng = np.random.default_rng(6)
    text = rng.standard_normal((7, glob.shape[1]))
    text /= np.linalg.norm(text, axis=1, keepdims=True)
    full = FeatureSet(features=glob.numpy(), extras={"patch_features": patches.numpy()})
    for tau in (0.01, 0.05):
        readout = PatchReadout(text, tau)
        local = local_mcm(patches, torch.from_numpy(text), tau).numpy()
        reduced = FeatureSet(features=glob.numpy(), extras={readout.name: local}, meta={"patch_readouts": {readout.name: readout.describe()}})
        want = GLMCM(tau=tau).score(full, text, normalize=True)
        got = GLMCM(tau=tau).score(reduced, text, normalize=True)
        assert np.ptp(local) > 0 and local.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
