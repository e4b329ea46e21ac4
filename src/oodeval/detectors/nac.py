"""NAC-UE: neuron activation coverage (Liu et al., ICLR 2024), on states captured at extraction.

Reads FeatureSet extras ``nac/<layer>`` (N, C_layer): the raw products pool(o) * pool(dL/do)
written by :func:`oodeval.features.taps.nac_states`. Per layer, with s = sigmoid(alpha * state):

* fit: a histogram of s per neuron over M - 1 intervals of the release's non-uniform grid on
  [0, 1.2] (finer near 0 and 1); coverage of an interval = min(count / O, 1);
* score: for each neuron the coverage of the interval its s falls in, averaged over neurons;
  the layer scores are averaged over layers. Higher = better covered = more ID.

Defaults are the release's ResNet-50 ImageNet configuration (``nac_imagenet.yml``):
avgpool (= ``pre_logits``) O=10, M=50, alpha=3000; layer3 O=500, M=50, alpha=300;
layer2 O=50, M=500, alpha=0.01; layer1 O=5000, M=1000, alpha=1; fitted on ``n_fit`` = 1000
ID-train samples drawn class-balanced with a seed (the release's ``valid_num``). O counts
samples, so it only keeps its meaning at the release's n_fit. Layers with other names fall back
to the avgpool setting. The release's ViT setting (final norm, read at the classifier's token(s),
and ``ln_2`` of the last three blocks, n_fit = 50,000), applied to every ViT-like backbone (ViT,
DeiT, DINOv2, EVA02, DINOv3, XCiT), and the choice per backbone come from :meth:`NAC.backbone_defaults`
(BierOne/ood_coverage ``configs/postprocessors/nac/``); explicit ``layer_params`` / ``n_fit`` win,
``layer_params`` merged layer by layer and key by key. NAC fits on its own rows (``fits_on``): the
tapped class-balanced subset of ID train that extraction writes when ID train holds no taps.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit

from ..errors import InputError
from ..features import FeatureSet
from ..params import POSITIVE, SEED, Instance, Integral, Interval
from ..features.sampling import fit_rows
from . import register
from ._common import chunks
from .base import BackboneInfo, Default, Detector, TappedRows

__all__ = ["NAC", "NAC_DEFAULTS", "NAC_VIT_NORM", "NAC_VIT_BLOCKS", "NAC_N_FIT", "nac_grid", "fit_rows"]

PREFIX = "nac/"

#: the release's ResNet-50 / ImageNet per-layer (O, M, alpha)
NAC_DEFAULTS: dict[str, dict[str, float]] = {
    "pre_logits": {"O": 10, "M": 50, "alpha": 3000.0},
    "layer3": {"O": 500, "M": 50, "alpha": 300.0},
    "layer2": {"O": 50, "M": 500, "alpha": 0.01},
    "layer1": {"O": 5000, "M": 1000, "alpha": 1.0},
}
FALLBACK = "pre_logits"
#: the release's ViT-B/16 ImageNet setting (``vit/nac_imagenet.yml``): the final LayerNorm, then
#: ``ln_2`` of the last, second-last and third-last blocks
NAC_VIT_NORM = {"O": 500, "M": 50, "alpha": 100.0}
NAC_VIT_BLOCKS = ({"O": 50, "M": 500, "alpha": 1.0}, {"O": 10, "M": 500, "alpha": 10.0},
                  {"O": 10, "M": 1000, "alpha": 1.0})  # fmt: skip
#: the release's ``valid_num`` (fitting rows) per backbone family
NAC_N_FIT = {"resnet": 1000, "vit": 50000}


def nac_grid(m: int) -> np.ndarray:
    """The release's m interval edges: m - 1 points from 0 to 1.01 (log-spaced towards 0 and
    towards 1, mirrored), then 1.2 appended. The release builds m // 2 points per side, so an
    odd M would silently become M - 1: it is refused."""
    if m < 4 or m % 2:
        raise InputError(f"nac needs an even M >= 4 (bins per neuron), got {m}")
    half = m // 2
    x = np.linspace(1.0, np.sqrt(1e3), half)
    left = np.log(x) / np.log(1e3)
    grid = np.concatenate([left[:-1], (1.0 - left)[::-1]])
    grid[-1] += 1e-2
    return np.append(grid, 1.2)


class LayerParams:
    """The constraint of ``layer_params``: {layer: {"O": > 0, "M": an even integer >= 4, "alpha": > 0}},
    each key optional (the rest from :data:`NAC_DEFAULTS`)."""

    SPEC = {"O": POSITIVE, "M": Interval(Integral, 4, None), "alpha": POSITIVE}

    def accepts(self, value: object) -> bool:
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, dict) for k, v in value.items()):
            return False
        return all(set(p) <= set(self.SPEC) and all(self.SPEC[k].accepts(x) for k, x in p.items()) and p.get("M", 4) % 2 == 0
                   for p in value.values())  # fmt: skip

    def __str__(self) -> str:
        return "a table {layer: {O: a number > 0, M: an even integer >= 4, alpha: a number > 0}}"

    def outside(self) -> list[object]:
        return [{"pre_logits": {"M": 5}}, {"pre_logits": {"O": 0}}, {"pre_logits": {"beta": 1}}]


def _interval(s: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Interval index of each value (-1 when outside [grid[0], grid[-1]))."""
    idx = np.searchsorted(grid, s, side="right") - 1
    idx[(idx < 0) | (idx >= grid.size - 1)] = -1
    return idx


def _layer_params(backbone: BackboneInfo) -> dict[str, dict]:
    """Per-layer (O, M, alpha) of the recorded NAC taps. A ViT block's setting depends on its place
    from the last block: ``meta["nac_roles"]`` (recorded at extraction: 0 = final norm, k = k-th
    block from the last) where present; else parsed from ``blocks.N.norm2`` with ``meta["depth"]``
    (the block count; without it the deepest tapped block counts as the last)."""
    taps, roles, depth = list(backbone.taps), backbone.meta.get("nac_roles"), backbone.meta.get("depth")
    if not backbone.vit_like:  # ResNet's (O, M, alpha), deepest first, layer by layer
        return {name: dict(p) for name, p in zip(taps, NAC_DEFAULTS.values())}
    recipe = (NAC_VIT_NORM, *NAC_VIT_BLOCKS)
    if roles:
        return {name: dict(recipe[int(roles[name])]) for name in taps if name in roles and 0 <= int(roles[name]) < len(recipe)}
    blocks = {}
    for name in taps:
        parts = name.split(".")
        if len(parts) == 3 and parts[0] == "blocks" and parts[2] == "norm2" and parts[1].isdigit():
            blocks[name] = int(parts[1])
    last = depth - 1 if depth else max(blocks.values(), default=0)
    out = {name: dict(NAC_VIT_NORM) for name in taps if name in ("norm", "fc_norm")}
    for name, i in blocks.items():
        if 0 <= last - i < len(NAC_VIT_BLOCKS):
            out[name] = dict(NAC_VIT_BLOCKS[last - i])
    return out


@register("nac", tags=("paper21", "feature"), order=19)
class NAC(Detector):
    """NAC-UE (Liu et al., "Neuron activation coverage", ICLR 2024); see the module docstring.

    layers: which ``nac/<layer>`` extras to use (default: all present in the train set).
    layer_params: {layer: {"O", "M", "alpha"}} overriding :data:`NAC_DEFAULTS`.
    n_fit: ID-train samples to build coverage from (None = all); seed draws them.
    """

    label = "NAC"

    needs = ("extra:nac/*",)
    fit_needs = ("extra:nac/*",)
    constraints = {"layers": (Instance(list, tuple), None), "layer_params": (LayerParams(), None),
                   "n_fit": (Interval(Integral, 1, None), None), "seed": SEED}  # fmt: skip
    fits_on = TappedRows(size="n_fit", seed="seed")
    merged_params = ("layer_params",)

    @classmethod
    def backbone_defaults(cls, backbone: BackboneInfo) -> dict[str, Default]:
        """``n_fit`` and ``layer_params`` (BierOne/ood_coverage ``configs/postprocessors/nac/``):
        ResNet ``resnet/nac_imagenet.yml`` (avgpool/layer3/layer2/layer1, ``valid_num`` 1000, the
        class defaults); ViT ``vit/nac_imagenet.yml``: the final LayerNorm (``encoder.ln`` = timm
        ``norm`` / ``fc_norm``) O/M/alpha 500/50/100 and ``ln_2`` of the last three blocks (timm
        ``<block>.norm2``) 50/500/1, 10/500/10, 10/1000/1, ``valid_num`` 50000, for every ViT-like
        family on its own block names (the place of each tap is recorded at extraction,
        ``meta["nac_roles"]``). The release has no setting for other families; they get the ResNet
        values layer by layer in depth order (deepest tap = avgpool's) and ``n_fit`` 1000."""
        family, vit = backbone.family, backbone.vit_like
        if family == "resnet":
            source = "NAC release resnet/nac_imagenet.yml"
        elif vit:
            source = "NAC release vit/nac_imagenet.yml" + ("" if family == "vit" else f" ({family} is a ViT)")
        else:
            source = f"no NAC release setting for {family}: ResNet-50's, layer by layer in depth order"
        out = {"n_fit": Default(NAC_N_FIT["vit" if vit else "resnet"], source)}
        if backbone.taps and family != "resnet":  # ResNet layers are the class defaults, by name
            out["layer_params"] = Default(_layer_params(backbone), source)
        return out

    @classmethod
    def backbone_notes(cls, backbone: BackboneInfo) -> list[str]:
        """Where each tapped layer is read (``meta["nac_readout"]``, recorded at extraction)."""
        readout = backbone.meta.get("nac_readout") or {}
        return ["reads " + "; ".join(f"{layer}: {how}" for layer, how in readout.items())] if readout else []

    def __init__(
        self,
        layers: list[str] | None = None,
        layer_params: dict | None = None,
        n_fit: int | None = 1000,
        seed: int = 0,
    ) -> None:
        self.layers = layers
        self.layer_params = layer_params
        self.n_fit = n_fit
        self.seed = seed

    def _params(self, layer: str) -> dict[str, float]:
        p = dict(NAC_DEFAULTS.get(layer, NAC_DEFAULTS[FALLBACK]))
        p.update((self.layer_params or {}).get(layer, {}))
        return p

    def _fit(self, train: FeatureSet) -> None:
        found = sorted(k[len(PREFIX) :] for k in train.extras if k.startswith(PREFIX))
        layers = list(self.layers) if self.layers is not None else found
        missing = [name for name in layers if name not in found]
        if missing or not layers:
            raise InputError(
                f"nac: the train set lacks NAC states {[PREFIX + n for n in missing or layers]}; "
                f"it has {[PREFIX + n for n in found]}"
            )
        rows = fit_rows(train.labels, self.n_fit, self.seed)
        self.layers_ = layers
        self.fit_rows_ = rows
        self.grids_, self.coverage_, self.params_ = {}, {}, {}
        for name in layers:
            p = self._params(name)
            grid = nac_grid(int(p["M"]))
            s = expit(p["alpha"] * np.asarray(train.extras[PREFIX + name][rows], dtype=np.float64))
            idx = _interval(s, grid)
            n_int, width = grid.size - 1, s.shape[1]
            flat = (idx + n_int * np.arange(width)[None, :])[idx >= 0]
            counts = np.bincount(flat, minlength=n_int * width).reshape(width, n_int)
            self.grids_[name] = grid
            self.coverage_[name] = np.minimum(counts / float(p["O"]), 1.0)
            self.params_[name] = p

    def _score(self, x: FeatureSet) -> np.ndarray:
        missing = [name for name in self.layers_ if PREFIX + name not in x.extras]
        if missing:
            raise InputError(f"nac: this FeatureSet lacks NAC states {[PREFIX + n for n in missing]}")
        total = np.zeros(len(x))
        for name in self.layers_:
            state = x.extras[PREFIX + name]
            cov, grid, alpha = self.coverage_[name], self.grids_[name], self.params_[name]["alpha"]
            if state.shape[1] != cov.shape[0]:
                raise InputError(f"nac layer {name}: fitted on {cov.shape[0]} neurons, got {state.shape[1]}")
            for sl in chunks(len(x), state.shape[1]):
                s = expit(alpha * np.asarray(state[sl], dtype=np.float64))
                idx = _interval(s, grid)
                vals = np.where(idx >= 0, cov[np.arange(cov.shape[0])[None, :], np.maximum(idx, 0)], 0.0)
                total[sl] += vals.mean(axis=1)
        return total / len(self.layers_)
