"""Activation- and weight-shaping detectors: ReAct, ASH-S, SCALE, DICE (paper Sec. 2.1, group ii).

Each reshapes the penultimate feature z (or the head W) and reads out the energy
logsumexp(W z' + b) with T = 1. They work on the pooled feature z (N, D) the FeatureSet stores,
which is what the papers' ImageNet ResNet-50 results use (ASH/SCALE act on the (B, 2048, 1, 1)
map after average pooling). ``compute_dtype="float32"`` (default): the shaping and the head product
in float32, the shaping sums and the log-sum-exp in float64; "float64": all in float64. Each also
takes ``device`` (None = numpy, or a torch device for the head product). float32 guarantees: each logit of the shaped
feature s is off by at most about sqrt(D) eps |w_c| |s| (the sgemm's rounding, eps = 2^-24), the
log-sum-exp adds a few ulps; the shapings are nonlinear, so an offset they keep enters through |s|
(Spearman 1.000000 with float64 on the conditioned problems of tests/test_detectors_precision.py).

The peers' shaping methods follow (opt-in, ``OptInDetector``): ASH-B and ASH-P beside ASH-S, VRA's
clip and LTS's logit scaling, each read out as above; docs/detectors.md ("The peers' methods").
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from ..features import FeatureSet
from ..params import BOOLEAN, COMPUTE, Interval, Options, Real
from . import register
from ._backend import Compute
from ._common import as64, chunked_percentile, logsumexp_rows, mean_rows
from .base import BackboneInfo, Default, Detector, OptInDetector

__all__ = ["ReAct", "ASHS", "SCALE", "DICE", "ash_s_features", "scale_features",
           "ASHB", "ASHP", "VRA", "LTS", "ash_b_features", "ash_p_features", "OptFS"]


def _energy_of(comp: Compute, x: FeatureSet, shape, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """logsumexp(shape(z) W^T + b) per row: product in ``comp``'s dtype, the sum in float64.
    The shaping, the product and the readout (in place on the product) run block by block, split
    across cores (:meth:`Compute.by_rows`). On a torch device each chunk is shaped on the host (the
    shapings are numpy functions) in the product dtype, then multiplied there. A shaping may
    return (s, r), r a factor per row (in the product dtype): then (s r) W = r (s W) is formed,
    the factor applied to the row's C logits in place, not to its D features in a new array."""
    z = x.features
    w, b = comp.put(weight).T, comp.put(bias)
    width = max(z.shape[1], w.shape[1])

    def readout(shaped, put=lambda a: a):
        s, r = shaped if isinstance(shaped, tuple) else (shaped, None)
        f = put(s) @ w
        if r is not None:
            f *= put(r)[:, None]
        f += b
        return comp.logsumexp(f, overwrite=True)

    if comp.device is None:
        return comp.map_rows(lambda zb: readout(shape(zb)), z, width=width)
    host = np.dtype(comp.precision)
    return np.concatenate([comp.get(readout(shape(np.asarray(z[sl], dtype=host)), comp.put)) for sl in comp.chunks(len(z), width)])


def _keep(d: int, percentile: float) -> int:
    """k = D - round(D * percentile / 100) entries kept (the releases' rounding)."""
    k = d - int(np.round(d * percentile / 100.0))
    if k < 1:
        raise InputError(f"percentile {percentile} keeps no entries of a {d}-dimensional feature")
    return k


def _ratio(s1: np.ndarray, s2: np.ndarray) -> np.ndarray:
    """s1 / s2, with 0 (no rescaling) where the kept sum s2 is 0 instead of a division by zero."""
    return np.divide(s1, s2, out=np.zeros_like(s1), where=s2 != 0)


def ash_s_features(z: np.ndarray, percentile: float) -> np.ndarray:
    """ASH-S: zero all but the top k entries of each row, then multiply by exp(s1 / s2),
    s1 = sum of the row, s2 = sum of the kept entries."""
    kept, factor = _ash_s_parts(z, percentile)
    kept *= factor[:, None]
    return kept


def _ash_s_parts(z: np.ndarray, percentile: float) -> tuple[np.ndarray, np.ndarray]:
    """(the pruned rows, each row's factor exp(s1 / s2) in z's dtype): ASH-S's shaping before its
    multiplication (:func:`_energy_of` applies the factor to the logits)."""
    kept, s2 = _top_k(z, _keep(z.shape[1], percentile), top_sum=True)
    return kept, np.exp(_ratio(_sum64(z), s2)).astype(z.dtype)


def _top_k(z: np.ndarray, k: int, top_sum: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """z with all but the k largest entries of each row set to 0: the entries >= the row's k-th
    largest value t (one partition and one comparison); a row with more than k of them and t != 0
    (ties at t) keeps exactly k (argpartition). Extra entries equal to t = 0 change nothing.
    ``top_sum``: also the float64 sum of each row's k largest values (the kept entries' sum,
    read from the partition's top k, not from a pass over the kept row)."""
    d = z.shape[1]
    part = np.partition(z, d - k, axis=1)
    t = part[:, d - k, None]
    above = z >= t
    kept = np.multiply(z, above, dtype=z.dtype)  # z where above, else 0 (-0 for z < 0): a third of np.where's time
    ties = np.flatnonzero((t[:, 0] != 0) & (np.count_nonzero(above, axis=1) > k))
    if ties.size:
        rows = z[ties]
        top = np.argpartition(rows, d - k, axis=1)[:, d - k :]
        exact = np.zeros_like(rows)
        np.put_along_axis(exact, top, np.take_along_axis(rows, top, axis=1), axis=1)
        kept[ties] = exact
    return (kept, _sum64(part[:, d - k :])) if top_sum else kept


def scale_features(z: np.ndarray, percentile: float) -> np.ndarray:
    """SCALE: multiply the whole row by exp(s1 / s2), no pruning (s2 = sum of the top k)."""
    return z * _scale_factor(z, percentile)[:, None]


def _scale_factor(z: np.ndarray, percentile: float) -> np.ndarray:
    """SCALE's factor exp(s1 / s2) of each row, in z's dtype."""
    d = z.shape[1]
    k = _keep(d, percentile)
    s2 = _sum64(np.partition(z, d - k, axis=1)[:, d - k :])
    return np.exp(_ratio(_sum64(z), s2)).astype(z.dtype)


def _sum64(a: np.ndarray) -> np.ndarray:
    """Row sums accumulated in float64 (einsum casts in its inner loop: faster than ``sum``'s
    buffered cast)."""
    return np.einsum("ij->i", a, dtype=np.float64)


@register("react", tags=("paper21", "activation"), order=6)
class ReAct(Detector):
    """Energy + ReAct: s = logsumexp(W min(z, c) + b) (Sun, Guo & Li, NeurIPS 2021).

    c is the ``percentile``-th percentile (default 90, the paper's choice) of all entries of the
    ID-train features, computed exactly (``np.percentile``'s linear interpolation) in two
    chunked passes. Only the upper side is clipped, as in the release.
    """

    label = "E+ReAct"

    needs = ("features", "head")
    fit_needs = ("features",)

    constraints = {"percentile": Interval(Real, 0, 100), **COMPUTE}

    def __init__(self, percentile: float = 90.0, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.percentile = percentile
        self.compute_dtype = compute_dtype
        self.device = device

    def _fit(self, train: FeatureSet) -> None:
        self.threshold_ = chunked_percentile(train.features, self.percentile)

    def _score(self, x: FeatureSet) -> np.ndarray:
        return _energy_of(self._compute(), x, lambda z: np.minimum(z, self.threshold_), x.weight, x.bias)


#: ASH-S's release percentile per backbone family, with its source
_ASH_RELEASE = {
    "resnet": (90.0, "ASH release config/imagenet_config.yml: ash_s@90 (ResNet-50)"),
    "vit": (95.0, "ASH release config/vit_config.yml: ash_s@95 (ViT)"),
    "eva": (95.0, "ASH release config/vit_config.yml: ash_s@95 (ViT; EVA02/DINOv3 are ViTs)"),
    "xcit": (95.0, "ASH release config/vit_config.yml: ash_s@95 (ViT; XCiT is ViT-like)"),
    "densenet": (99.0, "ASH release config/densenet_config.yml: ash_s@99 (DenseNet-121)"),
}


@register("ash_s", tags=("paper21", "activation"), order=7)
class ASHS(Detector):
    """ASH-S: keep the top (100 - p)% entries of z, scale by exp(s1 / s2), energy readout.

    Djurisic et al., "Extremely simple activation shaping for OOD detection", ICLR 2023.
    s1 = sum z, s2 = sum of the kept entries, k = D - round(D p / 100) kept. Default p = 90 (the
    paper's ImageNet ResNet-50 setting, "ASH-S@90"); the release's ViT (95) and DenseNet (99)
    settings come from :meth:`backbone_defaults`. Not OpenOOD's "ash"
    postprocessor, which is ASH-B; ASH-B and ASH-P are not implemented. Rows whose kept sum is
    0 are not rescaled (the release would divide by zero).
    """

    label = "ASH-S"

    needs = ("features", "head")

    constraints = {"percentile": Interval(Real, 0, 100, closed="left"), **COMPUTE}

    @classmethod
    def backbone_defaults(cls, backbone: BackboneInfo) -> dict[str, Default]:
        """``percentile``: ResNet-50 / MobileNetV2 90, ViT 95, DenseNet-121 99 (andrijazz/ash
        ``config/{imagenet,mobilenet,vit,densenet}_config.yml``: ``ash_s@90``, ``ash_s@90``,
        ``ash_s@95``, ``ash_s@99``); ViT-like families take the ViT value; every other family keeps
        the paper's 90 (the release runs no ASH-S on ConvNeXt, Swin or EfficientNet)."""
        value, source = _ASH_RELEASE.get(backbone.family, (90.0, f"no ASH release setting for {backbone.family}: the paper's ImageNet p=90"))
        return {"percentile": Default(value, source)}

    def __init__(self, percentile: float = 90.0, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.percentile = percentile
        self.compute_dtype = compute_dtype
        self.device = device

    def _score(self, x: FeatureSet) -> np.ndarray:
        return _energy_of(self._compute(), x, lambda z: _ash_s_parts(z, self.percentile), x.weight, x.bias)


@register("scale", tags=("paper21", "activation"), order=8)
class SCALE(Detector):
    """SCALE: z * exp(s1 / s2) without pruning, energy readout.

    Xu et al., "Scaling for training time and post-hoc OOD detection enhancement", ICLR 2024.
    s1 = sum z, s2 = sum of the top (100 - p)% entries. Default p = 85 (the paper's ImageNet
    setting; the release's ``configs/postprocessors/scale.yml`` sets percentile 85). pytorch-ood
    takes the percentile as a fraction (0.85).
    """

    label = "SCALE"

    needs = ("features", "head")

    constraints = {"percentile": Interval(Real, 0, 100, closed="left"), **COMPUTE}

    def __init__(self, percentile: float = 85.0, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.percentile = percentile
        self.compute_dtype = compute_dtype
        self.device = device

    def _score(self, x: FeatureSet) -> np.ndarray:
        return _energy_of(self._compute(), x, lambda z: (z, _scale_factor(z, self.percentile)), x.weight, x.bias)


@register("dice", tags=("paper21", "activation"), order=9)
class DICE(Detector):
    """DICE: energy with the head masked to its most contributing weights (Sun & Li, ECCV 2022).

    V = zbar * W (C, D) with zbar the mean ID-train feature; keep W where V > its
    ``percentile``-th percentile (over all C D entries), zero elsewhere; s = logsumexp(z W_masked^T + b).
    Default ``percentile`` = 70: the paper's ImageNet setting (sparsity 0.7; the release runs
    ``--p 70`` for ImageNet, 90 for CIFAR), named like ReAct's and ASH's ``percentile``.
    """

    label = "DICE"

    needs = ("features", "head")
    fit_needs = ("features", "head")

    constraints = {"percentile": Interval(Real, 0, 100, closed="left"), **COMPUTE}

    def __init__(self, percentile: float = 70.0, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.percentile = percentile
        self.compute_dtype = compute_dtype
        self.device = device

    def _fit(self, train: FeatureSet) -> None:
        self.mean_feature_ = mean_rows(train.features, comp=self._compute())
        contrib = self.mean_feature_[None, :] * as64(train.weight)
        self.threshold_ = float(np.percentile(contrib, self.percentile))
        self.masked_weight_ = as64(train.weight) * (contrib > self.threshold_)
        self.bias_ = as64(train.bias)

    def _score(self, x: FeatureSet) -> np.ndarray:
        if x.weight.shape != self.masked_weight_.shape:
            raise InputError(f"dice was fitted with a {self.masked_weight_.shape} head, got {x.weight.shape}")
        return _energy_of(self._compute(), x, lambda z: z, self.masked_weight_, self.bias_)


def ash_p_features(z: np.ndarray, percentile: float) -> np.ndarray:
    """ASH-P: all but the top k = D - round(D p / 100) entries of each row set to 0."""
    return _top_k(z, _keep(z.shape[1], percentile))


def ash_b_features(z: np.ndarray, percentile: float) -> np.ndarray:
    """ASH-B: the top k entries of each row set to s1 / k (s1 = the row's sum), the rest to 0:
    the entries >= the row's k-th largest value t (one partition and one comparison); a row with
    more than k of them (ties at t, zeros included) fills exactly k (argpartition)."""
    d = z.shape[1]
    k = _keep(d, percentile)
    t = np.partition(z, d - k, axis=1)[:, d - k, None]
    above = z >= t
    fill = (_sum64(z) / k).astype(z.dtype)
    out = np.where(above, fill[:, None], z.dtype.type(0))
    ties = np.flatnonzero(np.count_nonzero(above, axis=1) > k)
    if ties.size:
        top = np.argpartition(z[ties], d - k, axis=1)[:, d - k :]
        exact = np.zeros((ties.size, d), dtype=z.dtype)
        np.put_along_axis(exact, top, np.broadcast_to(fill[ties, None], top.shape), axis=1)
        out[ties] = exact
    return out


@register("ash_b", tags=("activation",))
class ASHB(OptInDetector):
    """ASH-B: binarised top (100 - p)% of z, each kept entry s1 / k, energy readout.

    Djurisic et al., "Extremely simple activation shaping for OOD detection", ICLR 2023.
    Default p = 65, the paper's ImageNet ResNet-50 setting ("ASH-B@65"); OpenOOD's ``ash``
    postprocessor is ASH-B with p = 90 (``ash.yml``), pytorch-ood's ``ASH(variant="ash-b")``
    takes p as a fraction (default 0.65). Ties at the k-th value are broken arbitrarily, as by
    the releases' ``topk``.
    """

    needs = ("features", "head")

    constraints = {"percentile": Interval(Real, 0, 100, closed="left"), **COMPUTE}

    def __init__(self, percentile: float = 65.0, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.percentile = percentile
        self.compute_dtype = compute_dtype
        self.device = device

    def _score(self, x: FeatureSet) -> np.ndarray:
        return _energy_of(self._compute(), x, lambda z: ash_b_features(z, self.percentile), x.weight, x.bias)


@register("ash_p", tags=("activation",))
class ASHP(OptInDetector):
    """ASH-P: the top (100 - p)% entries of z kept, the rest 0 (no rescaling), energy readout.

    Djurisic et al., ICLR 2023; default p = 90, the paper's ImageNet ResNet-50 setting
    ("ASH-P@90"); pytorch-ood's ``ASH(variant="ash-p")`` defaults to 0.65.
    """

    needs = ("features", "head")

    constraints = {"percentile": Interval(Real, 0, 100, closed="left"), **COMPUTE}

    def __init__(self, percentile: float = 90.0, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.percentile = percentile
        self.compute_dtype = compute_dtype
        self.device = device

    def _score(self, x: FeatureSet) -> np.ndarray:
        return _energy_of(self._compute(), x, lambda z: ash_p_features(z, self.percentile), x.weight, x.bias)


def _column_percentiles(z: np.ndarray, qs: tuple[float, ...], block: int = 16) -> list[np.ndarray]:
    """[np.percentile(z, q, axis=0) for q in qs] (linear interpolation, float64): the columns of
    each block of ``block`` copied out contiguously and transposed (two copies: 3x faster than one
    strided transpose of the rows), sorted in z's own dtype (numpy's vectorised sort: at 20k and
    200k rows a third of the time of a partition at the four order statistics two qs need), the
    order statistics the qs need picked, then numpy's interpolation in float64."""
    n = len(z)
    ranks = [(n - 1) * (q / 100.0) for q in qs]  # numpy's virtual index
    kth = sorted({int(np.floor(r)) for r in ranks} | {int(np.ceil(r)) for r in ranks})
    at = {k: i for i, k in enumerate(kth)}
    picked = np.empty((len(kth), z.shape[1]))
    for c in range(0, z.shape[1], block):
        cols = np.ascontiguousarray(np.ascontiguousarray(z[:, c : c + block]).T)
        picked[:, c : c + block] = np.sort(cols, axis=1)[:, kth].T
    out = []
    for r in ranks:
        a, b, t = picked[at[int(np.floor(r))]], picked[at[int(np.ceil(r))]], r - np.floor(r)
        out.append(b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t)  # numpy's _lerp
    return out


@register("vra", tags=("activation",))
class VRA(OptInDetector):
    """VRA as its releases run it: z clipped to [lo, hi], energy readout (Xu et al., NeurIPS 2023).

    lo, hi = the ``low``-th and ``high``-th percentiles of the ID-train features: over all their
    entries (default, OpenOOD's, with its defaults 10 and 90), or per feature dimension with
    ``per_dim`` (pytorch-ood's, with its defaults 1 and 99). The paper's VRA-P also zeroes
    entries below lo and adds an offset to those kept; neither release does, nor does this.
    """

    needs = ("features", "head")
    fit_needs = ("features",)

    constraints = {"low": Interval(Real, 0, 100), "high": Interval(Real, 0, 100), "per_dim": BOOLEAN, **COMPUTE}

    def __init__(self, low: float = 10.0, high: float = 90.0, per_dim: bool = False, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.low = low
        self.high = high
        self.per_dim = per_dim
        self.compute_dtype = compute_dtype
        self.device = device

    def _fit(self, train: FeatureSet) -> None:
        if not self.low <= self.high:
            raise InputError(f"detector 'vra': low={self.low} must not exceed high={self.high}")
        z = train.features
        if self.per_dim:
            self.lower_, self.upper_ = _column_percentiles(z, (self.low, self.high))
        else:
            self.lower_, self.upper_ = chunked_percentile(z, self.low), chunked_percentile(z, self.high)

    def _score(self, x: FeatureSet) -> np.ndarray:
        host = Compute(self.compute_dtype)  # the clip runs on host blocks, into a scratch buffer

        def clip(z):
            lo = np.asarray(self.lower_, dtype=z.dtype)
            return np.clip(z, lo, np.asarray(self.upper_, dtype=z.dtype), out=host.scratch_like(z, "shape"))

        return _energy_of(self._compute(), x, clip, x.weight, x.bias)


#: float32 exp's least argument with a normal result (exp(-87.3) is float32's least normal value)
EXP_NORMAL_FLOOR = -87.0


def _scaled_logsumexp(comp: Compute, f, scale):
    """logsumexp(s f) per row for positive row scales s (float64), in one scratch buffer: the row
    max m of f, then s (f - m) (rounded to the product dtype) raised to :data:`EXP_NORMAL_FLOOR`
    before the exp (a term below exp(-87) adds at most C 2e-38 to a sum of at least 1: nothing in
    float64, while float32 exp takes ~10x longer where its results are subnormal; LTS's scales
    spread a row's logits that far), the sum in float64; s m + log(sum). The max of s f is s m
    (s > 0), so the row's own max shifts it."""
    m = comp.rowmax(f)
    a = comp.subtract(f, m[:, None], out=comp.scratch_like(f))
    a *= comp.put(scale)[:, None]
    if isinstance(a, np.ndarray):
        np.maximum(a, EXP_NORMAL_FLOOR, out=a)
        np.exp(a, out=a)
    else:
        a.clamp_(min=EXP_NORMAL_FLOOR).exp_()
    return comp.put(scale, "float64") * comp.put(m, "float64") + comp.log(comp.rowsum(a))


@register("lts", tags=("activation",))
class LTS(OptInDetector):
    """Logit scaling: s = logsumexp(S f), S = (sum relu(z) / sum of the top k of relu(z))^2.

    Djurisic et al., "Logit scaling for out-of-distribution detection" (pytorch-ood's ``LTS``);
    k = max(1, D - round(D (1 - p))), default p = 0.05 (the top 5%), as that release; f the
    cached logits. A row whose top-k sum is 0 is not rescaled (S = 1). The top k of relu(z) are
    relu of the top k of z (relu is monotone), so one partition of z finds them.
    ``compute_dtype="float32"`` (default): the sums of float32 values accumulate in float64, S f
    is rounded to float32 (a float32 ulp of each scaled logit) and read out as energy's
    log-sum-exp; the sum of relu(z) (magnitudes) is float32 runs of 64 added in float64
    (:meth:`~oodeval.detectors._backend.Compute.runsum`, off by at most 64 u = 3.8e-6 of itself),
    and relu(z) is partitioned in place for its top k; "float64": everything in float64.
    ``device``: None = numpy, or a torch device.
    """

    needs = ("features", "logits")

    constraints = {"p": Interval(Real, 0, 1, closed="right"), **COMPUTE}

    def __init__(self, p: float = 0.05, compute_dtype: str = "float32", device: str | None = None) -> None:
        self.p = p
        self.compute_dtype = compute_dtype
        self.device = device

    def _score(self, x: FeatureSet) -> np.ndarray:
        comp = self._compute()
        d = x.features.shape[1]
        k = max(1, d - int(round(d * (1 - self.p))))

        def block(z, f):
            if isinstance(z, np.ndarray):
                relu = np.maximum(z, 0, out=comp.scratch_like(z, "z"))
                s1 = comp.runsum(relu)
                relu.partition(d - k, axis=1)  # in place: its last k entries are the top k
                s2 = comp.rowsum(relu[:, d - k :])
            else:
                relu = z.clamp(min=0)
                s1, s2 = comp.runsum(relu), comp.rowsum(comp.topk(relu, k))
            s1, s2 = comp.get(s1), comp.get(s2)
            empty = s2 <= 0
            ratio = s1 / (s2 + empty)  # a row with nothing above 0 is not rescaled
            ratio[empty] = 1.0
            return _scaled_logsumexp(comp, f, ratio * ratio)

        return comp.map_rows(block, x.features, x.logits)


@register("optfs", tags=("activation", "since-paper"))
class OptFS(OptInDetector):
    """Optimal feature shaping: s = w_y . h(z), h(z)_d = theta_k z_d for z_d in interval k (0 outside).

    Zhao, Xu, Gupta, Asthana, Zheng & Gould, "Towards optimal feature-shaping methods for
    out-of-distribution detection", ICLR 2024; the authors' release (Qinyu-Allen-Zhao/OptFSOOD,
    ``detector/ours.py`` at 84f8f108a87479e7e2092b56d432823ce685a1fa, ``use_ood_score="vanilla"``, fixed
    weights). Fit on ID train: lo, hi = the 0.1% and 99.9% quantiles of all feature values; 100
    intervals [lo + i (hi - lo)/100, + (hi - lo)/100) from ``np.arange(lo, hi, width)``;
    theta_k = 1000 I_k / ||I||, I_k = mean over rows of sum_d [z_d in k] w_{y,d} z_d with y the
    argmax of the row's logits (the closed form from ID data only). Score with y = argmax f:
    ``readout`` "vanilla" (default): s = w_y . h(z) (no bias); "energy": logsumexp(W h(z) + b).
    A value on an interval's edge belongs to the interval it starts (the release's masks, which
    may also count it in a neighbour where arange's rounding makes two edges overlap). float64.
    """

    label = "OptFS"

    needs = ("features", "logits", "head")
    fit_needs = ("features", "logits", "head")

    constraints = {"readout": Options("vanilla", "energy")}

    def __init__(self, readout: str = "vanilla") -> None:
        self.readout = readout

    def _bins(self, z: np.ndarray) -> np.ndarray:
        """1 + the interval index of every entry of ``z`` (float32 or float64), 0 or K + 1 (K
        intervals) outside every interval: as a search of the edges, k = the largest k with
        left_k <= z, inside when z < left_k + width. The edges are arange's lo + k width, so
        k = floor((z - lo) / width) wherever that quotient lies further than its rounding (and
        the edges') from a whole number, and z = lo exactly (ReLU features' zeros when lo = 0) is
        in the first; the few other entries that close to an edge take the search itself, on
        their own values. The quotient is formed in float32 (z, lo and 1 / width rounded to
        float32, two roundings more: within u (2 |lo| / width + 5 (K + 2)) of the exact one,
        u = 2^-24, where it matters, |quotient| <= K + 2), with a margin eight times that, so
        every index is the float64 search's: the same for a float32 input and its float64 copy."""
        left, right = self.left_edges_, self.right_edges_
        lo, width, size = float(left[0]), float(self.width_), left.size
        lo32 = np.float32(lo)
        tol = self.edge_tolerance_ + 8 * float(np.finfo(np.float32).eps) * (2 * abs(lo) / width + 2 * (size + 2))
        with np.errstate(over="ignore"):  # a float64 beyond float32's range: inf, outside every interval
            v = np.asarray(z, dtype=np.float32)
        q = np.subtract(v, lo32)
        q *= np.float32(1.0 / width)
        np.clip(q, -1.5, size + 1.5, out=q)  # outside the intervals by at least half a width
        k = np.floor(q)
        q -= k  # the quotient's fraction
        near = (q < tol) | (q > 1.0 - tol)
        if float(lo32) == lo:  # z = lo exactly is in the first interval
            near &= (v != lo32) if v is z else (z != lo)
        index = k.astype(np.intp)
        index += 1
        np.clip(index, 0, size + 1, out=index)
        if near.any():
            zn = np.asarray(z, dtype=np.float64)[near]
            kn = np.searchsorted(left, zn, side="right") - 1
            index[near] = np.where((kn >= 0) & (zn < right[np.maximum(kn, 0)]), kn + 1, 0)
        return index

    def _shape_index(self, z: np.ndarray, rows: int = 64) -> np.ndarray:
        """:meth:`_bins` of a block, ``rows`` rows at a time (its temporaries stay in a core's cache)."""
        return np.concatenate([self._bins(z[s : s + rows]) for s in range(0, len(z), rows)])

    def _fit(self, train: FeatureSet) -> None:
        z_all = train.features
        lo, hi = chunked_percentile(z_all, 0.1), chunked_percentile(z_all, 99.9)
        if not hi > lo:
            raise InputError(f"detector 'optfs': the 0.1% and 99.9% quantiles of the ID-train features are equal ({lo}); no intervals to shape")
        self.width_ = (hi - lo) / 100.0
        self.left_edges_ = np.arange(lo, hi, self.width_)
        self.right_edges_ = self.left_edges_ + self.width_
        # how far from a whole number (z - lo) / width may be and still be that search's answer:
        # the quotient's float64 rounding and the edges' own, in units of the width, with room
        eps = np.finfo(np.float64).eps
        self.edge_tolerance_ = max(1e-9, 64 * eps * (abs(lo) + abs(hi) + self.width_) / self.width_)
        w = as64(train.weight)
        size = self.left_edges_.size + 2  # index 0 and K + 1: outside every interval

        def part(z, f):  # one block's per-interval sums, kept apart and added in block order
            y = np.asarray(f).argmax(axis=1)
            return np.bincount(self._shape_index(z).ravel(), weights=(w[y] * as64(z)).ravel(), minlength=size)[None]

        # the blocks as stored (their intervals from their own values), the products in float64
        contribution = Compute("float64").by_rows(part, z_all, train.logits).sum(axis=0)[1:-1] / len(train)
        norm = np.linalg.norm(contribution)
        if norm == 0:
            raise InputError("detector 'optfs': every interval's logit contribution over ID train is 0")
        self.theta_ = contribution / norm * 1000.0

    def _score(self, x: FeatureSet) -> np.ndarray:
        w, b = as64(x.weight), as64(x.bias)
        theta = np.concatenate([[0.0], self.theta_, [0.0]])  # index 0 and K + 1: outside every interval
        host = Compute("float64")

        def block(z, f):
            shaped = as64(z) * theta[self._shape_index(z)]
            if self.readout == "vanilla":
                return host.rowdot(w[np.asarray(f).argmax(axis=1)], shaped)
            return logsumexp_rows(shaped @ w.T + b)

        return host.get(host.by_rows(block, x.features, x.logits))  # the blocks as stored, as in the fit
