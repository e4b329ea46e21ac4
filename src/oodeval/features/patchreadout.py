"""GL-MCM's patch readout, computed during extraction instead of storing the (N, P, E) patch tokens.

GL-MCM's local score (``zeroshot.scorers.GLMCM``, docs/zeroshot.md) reads the value-path patch tokens
u_1..u_P of an image (``features.valuepath``) only through

    local(x) = max_p max_c softmax_c(u_p' t_c / tau)

for the l2-normalised label embeddings t_1..t_C and the temperature tau: one float per image and
(label set, tau). :func:`local_mcm` computes it in float64 on the float32 tokens renormalised in float64,
exactly as the scorer does on stored tokens with ``normalize=True`` (the grid's path), so a score from
the readout equals the score from the full tensor to float64 rounding. A :class:`PatchReadout` names
one (label set, tau); its fingerprint (a hash of the float64 label embeddings, which covers the names,
templates and text tower) and tau enter the store's cache key, so a new label set or tau is a new
entry, never a reused readout. The readout is stored as the extra ``patch_readout/<fp16>-tau<tau>``
(float64 (N,)) with its description in ``meta["patch_readouts"]``.

The full tensor (``extract(patch_features=True)``) is stored as float16. Each stored component is
u_i (1 + d_i) + e_i with |d_i| <= 2^-11 (float16's unit roundoff) and |e_i| <= 2^-25 (half the subnormal
spacing, for |u_i| < 2^-14), so for unit u and t: ||u~ - u|| <= eps = 2^-11 + 2^-25 sqrt(E), the
cosine u~'t is off by at most eps, and after renormalisation (as the grid scores) by at most
2 eps / (1 - eps). A logit moves by at most delta = that / tau and every max-softmax, hence the local
score, by a factor within exp(+-2 delta): :func:`float16_error_bound`. For E <= 1536, tau = 0.01:
cosine <= 9.8e-4, relative local score <= 22% (worst case; the typical error is far smaller).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from .._io import hash_arrays
from ..errors import InputError

__all__ = ["PatchReadout", "PREFIX", "label_fingerprint", "local_mcm", "float16_error_bound", "stored_readout", "has_patch_data"]

#: name prefix of readout extras
PREFIX = "patch_readout/"
#: float64 values of one block of (rows, P, max(E, C)) tokens or logits computed at once
_BLOCK = 1 << 22


def label_fingerprint(text: np.ndarray) -> str:
    """Hash of the float64 label embeddings (C, E): the label set a readout belongs to."""
    return hash_arrays({"labels": np.ascontiguousarray(text, dtype=np.float64)})


@dataclass(frozen=True)
class PatchReadout:
    """One GL-MCM readout to compute during extraction: label embeddings (C, E), tau, a label-set name.

    ``text_tower``: the fingerprint of the model that encoded the labels
    (``backbones.text_tower_fingerprint``); extraction refuses a model whose text tower differs.
    """

    labels: np.ndarray = field(repr=False)
    tau: float
    label_set: str = "id"
    text_tower: str | None = None

    def __post_init__(self) -> None:
        labels = np.asarray(self.labels, dtype=np.float64)
        if labels.ndim != 2 or labels.shape[0] == 0 or not np.isfinite(labels).all():
            raise InputError(f"patch readout {self.label_set!r}: labels must be finite (C, E) with C >= 1, got shape {labels.shape}")
        if not float(self.tau) > 0:
            raise InputError(f"patch readout {self.label_set!r}: tau must be > 0, got {self.tau}")
        object.__setattr__(self, "labels", labels)
        object.__setattr__(self, "tau", float(self.tau))

    @property
    def fingerprint(self) -> str:
        return label_fingerprint(self.labels)

    @property
    def name(self) -> str:
        """The extra's name: ``patch_readout/<fingerprint[:16]>-tau<tau>``."""
        return readout_name(self.fingerprint, self.tau)

    def describe(self) -> dict:
        """What the store records (cache key and ``meta["patch_readouts"]``)."""
        return {"label_set": self.label_set, "labels": self.fingerprint, "n_labels": int(self.labels.shape[0]),
                "tau": self.tau, "readout": "max_p max_c softmax(u_p't_c/tau), float64"}


def readout_name(fingerprint: str, tau: float) -> str:
    return f"{PREFIX}{fingerprint[:16]}-tau{float(tau)!r}"


def local_mcm(patches: torch.Tensor, labels: torch.Tensor, tau: float) -> torch.Tensor:
    """float64 (B,) max over patches of the max-softmax over labels of ``patches`` (B, P, E), renormalised
    in float64, against ``labels`` (C, E) float64 on the same device; autocast off."""
    b, p, e = patches.shape
    rows = max(1, _BLOCK // max(1, p * max(e, labels.shape[0])))  # images per float64 block
    out = []
    with torch.autocast(device_type=patches.device.type, enabled=False):
        for s in range(0, b, rows):
            u = patches[s : s + rows].to(torch.float64)
            logits = (u / torch.linalg.vector_norm(u, dim=-1, keepdim=True)) @ labels.T / tau
            out.append(torch.exp(logits.amax(dim=-1) - torch.logsumexp(logits, dim=-1)).amax(dim=-1))
    return torch.cat(out)


def float16_error_bound(dim: int, tau: float) -> tuple[float, float]:
    """``(cosine, relative local score)`` worst-case errors of a float16-stored unit patch token of ``dim``
    components, renormalised, against unit labels at ``tau`` (module docstring)."""
    eps = 2.0**-11 + 2.0**-25 * math.sqrt(dim)
    cos = 2 * eps / (1 - eps)
    return cos, math.expm1(2 * cos / tau)


def has_patch_data(fs) -> bool:
    """Whether a FeatureSet holds GL-MCM patch data: the full tensor or a readout."""
    return "patch_features" in fs.extras or any(k.startswith(PREFIX) for k in fs.extras)


def stored_readout(fs, labels: np.ndarray, tau: float) -> np.ndarray | None:
    """The float64 (N,) readout of ``fs`` for label embeddings ``labels`` at ``tau``; None when ``fs`` holds
    no readout but the full tensor. Raises ValueError when its readouts are for other labels or tau only."""
    have = {k: v for k, v in fs.extras.items() if k.startswith(PREFIX)}
    if not have:
        return None
    fp = label_fingerprint(labels)
    want = readout_name(fp, tau)
    if want in have:
        out = np.asarray(have[want], dtype=np.float64)
        if out.shape != (len(fs),):
            raise InputError(f"gl_mcm: readout {want} of {fs.name!r} has shape {out.shape}, expected ({len(fs)},)")
        return out
    if "patch_features" in fs.extras:
        return None
    recorded = fs.meta.get("patch_readouts", {})
    stored = "; ".join(f"{r.get('label_set', '?')}: {r.get('n_labels', '?')} labels {str(r.get('labels', k))[:16]} at tau={r.get('tau', '?')}"
                       for k, r in ((k, recorded.get(k, {})) for k in sorted(have)))
    raise InputError(f"gl_mcm: the patch readout stored with {fs.name!r} was computed for another label set or temperature "
                     f"({stored}), not for these {len(labels)} labels {fp[:16]} at tau={float(tau)!r}; the label set or tau "
                     "changed since extraction: extract again with them (a new store entry; a readout is never reused)")
