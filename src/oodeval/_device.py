"""The one resolver of a torch device name (``--device`` and every ``device=`` that picks where a
network runs): ``auto``, ``cpu``, ``cuda`` or ``cuda:N``."""

from __future__ import annotations

import re

from ._extras import optional
from .errors import InputError

__all__ = ["resolve_device"]


def resolve_device(device: str = "auto"):
    """The ``torch.device`` for ``device``: ``"auto"`` is CUDA when torch sees a GPU, else the CPU;
    ``"cpu"``, ``"cuda"`` and ``"cuda:N"`` are taken as given. Anything else, or CUDA without a
    CUDA device, is an InputError."""
    torch = optional("torch")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if not re.fullmatch(r"cpu|cuda(:\d+)?", str(device)):
        raise InputError(f"device must be auto, cpu or cuda[:N], got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"device {device} was asked for but torch sees no CUDA device")
    return torch.device(device)
