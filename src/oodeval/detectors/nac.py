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
DeiT, DINOv2, EVA02, DINOv3, XCiT), and the choice per backbone come from
:func:`oodeval.detectors.defaults.resolve_defaults`; explicit ``layer_params`` / ``n_fit`` win.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit

from ..errors import InputError
from ..features import FeatureSet
from ..features.sampling import fit_rows
from . import register
from ._common import chunks
from .base import Detector

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


def _interval(s: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Interval index of each value (-1 when outside [grid[0], grid[-1]))."""
    idx = np.searchsorted(grid, s, side="right") - 1
    idx[(idx < 0) | (idx >= grid.size - 1)] = -1
    return idx


@register("nac", tags=("paper21", "feature"), order=19)
class NAC(Detector):
    """NAC-UE (Liu et al., "Neuron activation coverage", ICLR 2024); see the module docstring.

    layers: which ``nac/<layer>`` extras to use (default: all present in the train set).
    layer_params: {layer: {"O", "M", "alpha"}} overriding :data:`NAC_DEFAULTS`.
    n_fit: ID-train samples to build coverage from (None = all); seed draws them.
    """

    needs = ("extra:nac/*",)
    fit_needs = ("extra:nac/*",)

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
