"""Patch-level features of an open_clip ViT through the value path of its last block (GL-MCM).

GL-MCM (Miyai et al. 2023) scores local regions with patch embeddings taken from a pass in which
the last transformer block's attention output is replaced by its value branch (as in MaskCLIP):

    u = x + ls_1(out_proj(v_proj(ln_1(x))))        (v_proj = the value rows of in_proj)
    u = u + ls_2(mlp(ln_2(u)))
    patch_k = normalise(ln_post(u)[k] @ proj),      k = 1..P (the CLS token is dropped)

Everything before the last block is shared with the ordinary forward, so one call returns both
the global image embedding (== ``encode_image(normalize=True)``) and the (B, P, E) patch features.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["image_and_patch_features", "value_path_block", "check_supported"]


def check_supported(visual: nn.Module) -> None:
    """Raise ValueError unless ``visual`` is open_clip's standard ViT tower (CLS-token pooling)."""
    from open_clip.transformer import VisionTransformer

    if not isinstance(visual, VisionTransformer):
        raise ValueError(f"patch features need an open_clip VisionTransformer tower, not {type(visual).__name__}")
    if visual.attn_pool is not None or visual.pool_type != "tok" or visual.final_ln_after_pool:
        raise ValueError("patch features need a ViT tower with CLS-token pooling and ln_post before pooling "
                         f"(this one: pool_type={visual.pool_type!r}, attn_pool={visual.attn_pool is not None}, "
                         f"final_ln_after_pool={visual.final_ln_after_pool})")
    if not isinstance(visual.transformer.resblocks[-1].attn, nn.MultiheadAttention):
        raise ValueError("patch features need nn.MultiheadAttention in the last block")


def value_path_block(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The last block with its attention output replaced by the value branch; ``x`` is (B, L, D)."""
    attn: nn.MultiheadAttention = block.attn
    d = x.shape[-1]
    w_v = attn.in_proj_weight[2 * d :]
    b_v = None if attn.in_proj_bias is None else attn.in_proj_bias[2 * d :]
    v = F.linear(block.ln_1(x), w_v, b_v)
    u = x + block.ls_1(attn.out_proj(v))
    return u + block.ls_2(block.mlp(block.ln_2(u)))


def image_and_patch_features(visual: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(embeddings (B, E), patch features (B, P, E))``, both l2-normalised, from one shared trunk pass."""
    check_supported(visual)
    x = visual._embeds(images)
    tr = visual.transformer

    def run(block: nn.Module, h: torch.Tensor) -> torch.Tensor:  # h stays (B, L, D)
        return block(h) if tr.batch_first else block(h.transpose(0, 1)).transpose(0, 1)

    for block in tr.resblocks[:-1]:
        x = run(block, x)
    out = run(tr.resblocks[-1], x)
    patches = value_path_block(tr.resblocks[-1], x)
    pooled, _ = visual._pool(out)
    tokens = visual.ln_post(patches)[:, 1:]
    if visual.proj is not None:
        pooled = pooled @ visual.proj
        tokens = tokens @ visual.proj
    return F.normalize(pooled, dim=-1), F.normalize(tokens, dim=-1)
