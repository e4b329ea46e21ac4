"""Patch-level features of a VLM image tower through the value path of its last block (GL-MCM).

GL-MCM (Miyai et al. 2025; paper App. F) scores local regions with patch embeddings from a pass in
which the last transformer block's attention output is replaced by its value branch (MaskCLIP):

    u_i = x_i + out_proj(v(norm_1(x))_i)      (attention weights = identity, rest of the block unchanged)

This is computed by running the last block once more with an additive self-only attention mask
(0 on the diagonal, -inf elsewhere): each token's softmax then has one entry, so the attention
output is exactly its own value, whatever the attention implementation (fused qkv, q/k norms,
RoPE on q and k, SDPA or eager). Everything before the last block is shared with the ordinary
forward, so one call returns both the global embedding (== the model's own normalised image
embedding) and the (B, P, E) patch features. Tokens are mapped to the joint space as the tower
maps its pooled token:

- open_clip ViT (CLS pooling): ``ln_post`` then ``proj`` on every patch token (CLIP, MetaCLIP 2, OpenCLIP).
- open_clip timm towers (SigLIP, SigLIP 2, PE-Core: ``TimmModel`` over a timm ViT / EVA trunk):
  final norm, then the trunk's pooling applied to each patch token alone (an attention-pool head
  over a single token returns that token's value branch: the same rule one level up), ``fc_norm``,
  the trunk head and open_clip's projection head.
- Hugging Face AIMv2 (``Aimv2Model``): final RMSNorm, the attention-pooling head on each patch
  token alone, ``visual_projection``.

Prefix tokens (CLS, registers) are dropped. Any other tower raises ValueError naming why.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .._extras import optional
from ..errors import InputError

__all__ = ["image_and_patch_features", "self_only_mask", "check_supported"]


def self_only_mask(n: int, like: torch.Tensor) -> torch.Tensor:
    """(n, n) additive attention mask: 0 on the diagonal, -inf elsewhere (dtype/device of ``like``)."""
    mask = torch.full((n, n), float("-inf"), dtype=like.dtype, device=like.device)
    return mask.fill_diagonal_(0.0)


def _tower(model: nn.Module) -> tuple[str, nn.Module]:
    """``(kind, module)`` of the image tower of ``model`` (an open_clip model, its ``visual``, or AIMv2)."""
    TimmModel = optional("open_clip.timm_model").TimmModel
    VisionTransformer = optional("open_clip.transformer").VisionTransformer
    inner = getattr(model, "hf", model)  # oodeval.features.hf.HFCLIP wraps a transformers model
    if type(inner).__name__ == "Aimv2Model":
        return "aimv2", inner
    visual = getattr(model, "visual", model)
    if isinstance(visual, VisionTransformer):
        return "open_clip_vit", visual
    if isinstance(visual, TimmModel):
        return "timm", visual
    raise InputError(f"GL-MCM patch features: no value path for an image tower of type {type(visual).__name__} "
                     "(supported: open_clip ViT, open_clip timm ViT/EVA towers, Hugging Face AIMv2)")


def check_supported(model: nn.Module) -> None:
    """Raise ValueError (saying why) unless patch features can be computed for ``model``'s image tower."""
    kind, tower = _tower(model)
    if kind == "open_clip_vit":
        if tower.attn_pool is not None or tower.pool_type != "tok" or tower.final_ln_after_pool:
            raise InputError("GL-MCM patch features need an open_clip ViT with CLS-token pooling and ln_post before "
                             f"pooling (this one: pool_type={tower.pool_type!r}, attn_pool={tower.attn_pool is not None}, "
                             f"final_ln_after_pool={tower.final_ln_after_pool})")
    elif kind == "timm":
        trunk = tower.trunk
        if not hasattr(trunk, "blocks") or not hasattr(trunk, "fc_norm"):
            raise InputError(f"GL-MCM patch features need a timm ViT/EVA trunk, not {type(trunk).__name__}")
        pool = getattr(trunk, "attn_pool", None)
        if pool is not None and (getattr(pool, "pos_embed", None) is not None or getattr(pool, "latent_len", 1) != 1):
            raise InputError("GL-MCM patch features: the trunk's attention pool has a position embedding or several latents")
        if pool is None and getattr(trunk, "global_pool", "") not in ("token", "avg"):
            raise InputError(f"GL-MCM patch features: unsupported timm pooling {getattr(trunk, 'global_pool', None)!r}")
    elif not tower.vision_model.use_head:
        raise InputError("GL-MCM patch features: this AIMv2 vision tower has no pooling head (use_head=False)")


def _open_clip_vit(visual: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = visual._embeds(images)
    tr = visual.transformer
    mask = self_only_mask(x.shape[1], x)

    def run(block: nn.Module, h: torch.Tensor, **kw) -> torch.Tensor:  # h stays (B, L, D)
        return block(h, **kw) if tr.batch_first else block(h.transpose(0, 1), **kw).transpose(0, 1)

    for block in tr.resblocks[:-1]:
        x = run(block, x)
    out = run(tr.resblocks[-1], x)
    patches = run(tr.resblocks[-1], x, attn_mask=mask)
    pooled, _ = visual._pool(out)
    tokens = visual.ln_post(patches)[:, 1:]
    if visual.proj is not None:
        pooled = pooled @ visual.proj
        tokens = tokens @ visual.proj
    return pooled, tokens


def _timm(visual: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    trunk = visual.trunk
    last = trunk.blocks[-1]
    seen: dict = {}

    def grab(module, args, kwargs):
        seen["args"], seen["kwargs"] = args, kwargs

    hook = last.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        feats = trunk.forward_features(images)
    finally:
        hook.remove()
    pooled = visual.head(trunk.forward_head(feats))
    x, *rest = seen["args"]
    u = trunk.norm(last(x, *rest, **{**seen["kwargs"], "attn_mask": self_only_mask(x.shape[1], x)}))
    tokens = u[:, trunk.num_prefix_tokens :]
    b, n, c = tokens.shape
    one = tokens.reshape(b * n, 1, c)
    one = trunk.attn_pool(one) if trunk.attn_pool is not None else one[:, 0]
    one = visual.head(trunk.head(trunk.fc_norm(one)))
    return pooled, one.reshape(b, n, -1)


def _aimv2(model: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    vm = model.vision_model
    x = vm.embeddings(images)
    layers = vm.encoder.layers
    for layer in layers[:-1]:
        x = layer(x, None)
    out = layers[-1](x, None)
    u = layers[-1](x, self_only_mask(x.shape[1], x)[None, None])
    pooled = model.visual_projection(vm.head(vm.rms_norm(out)))
    tokens = vm.rms_norm(u)
    b, n, c = tokens.shape
    one = model.visual_projection(vm.head(tokens.reshape(b * n, 1, c)))
    return pooled, one.reshape(b, n, -1)


def image_and_patch_features(model: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(embeddings (B, E), patch features (B, P, E))``, both l2-normalised, from one shared trunk pass.

    ``model``: an open_clip model or its ``visual`` tower, or an AIMv2 model (bare or wrapped by
    ``oodeval.features.hf.HFCLIP``).
    """
    check_supported(model)
    kind, tower = _tower(model)
    pooled, tokens = {"open_clip_vit": _open_clip_vit, "timm": _timm, "aimv2": _aimv2}[kind](tower, images)
    return F.normalize(pooled, dim=-1), F.normalize(tokens, dim=-1)
