"""GL-MCM's local features: helper B's value-path pass against a hand-written last block (issue 5)."""

import numpy as np
import torch


def test_value_path_patches_equal_hand_written_last_block(tiny_clip):
    import open_clip

    from oodeval.features.valuepath import image_and_patch_features
    from oodeval.zeroshot import score_zeroshot
    from oodeval.features import FeatureSet

    torch.manual_seed(0)
    model, _, _ = open_clip.create_model_and_transforms(tiny_clip, pretrained=None)
    model.eval()
    vis = model.visual
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        glob, patches = image_and_patch_features(vis, images)
        # hand-written: patch embedding, CLS, positions, ln_pre, all blocks but the last (as-is),
        # then the last block with attention replaced by out_proj(W_v ln_1(x) + b_v), then MLP
        x = vis.conv1(images).flatten(2).transpose(1, 2)
        cls = vis.class_embedding.expand(3, 1, -1)
        x = torch.cat([cls, x], dim=1) + vis.positional_embedding
        x = vis.ln_pre(x)
        blocks = vis.transformer.resblocks
        for blk in blocks[:-1]:
            h = blk.ln_1(x)
            d = h.shape[-1]
            q, k, v = (h @ blk.attn.in_proj_weight[i * d : (i + 1) * d].T + blk.attn.in_proj_bias[i * d : (i + 1) * d] for i in range(3))
            heads = blk.attn.num_heads
            split = lambda t: t.reshape(3, -1, heads, d // heads).transpose(1, 2)
            att = torch.softmax(split(q) @ split(k).transpose(-1, -2) / (d // heads) ** 0.5, dim=-1)
            o = (att @ split(v)).transpose(1, 2).reshape(3, -1, d)
            x = x + blk.attn.out_proj(o)
            x = x + blk.mlp(blk.ln_2(x))
        last = blocks[-1]
        d = x.shape[-1]
        v = last.ln_1(x) @ last.attn.in_proj_weight[2 * d :].T + last.attn.in_proj_bias[2 * d :]
        u = x + last.attn.out_proj(v)
        u = u + last.mlp(last.ln_2(u))
        ref = vis.ln_post(u)[:, 1:] @ vis.proj
        ref = ref / ref.norm(dim=-1, keepdim=True)
        enc = model.encode_image(images, normalize=True)
    assert patches.shape == (3, (32 // 8) ** 2, 32)
    np.testing.assert_allclose(patches.numpy(), ref.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(glob.numpy(), enc.numpy(), rtol=1e-4, atol=1e-5)
    # and GL-MCM reads them
    text = torch.nn.functional.normalize(torch.randn(4, 32), dim=-1).numpy().astype(np.float64)
    fs = FeatureSet(features=glob.numpy(), extras={"patch_features": patches.numpy()})
    out = score_zeroshot("gl_mcm", fs, text)
    assert out.shape == (3,) and np.all((out > 0) & (out <= 2))
