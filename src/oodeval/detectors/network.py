"""The methods that need the network: ODIN, Mahalanobis with input preprocessing and its layer
ensemble, Gram, RankFeat and Monte-Carlo dropout, scoring what their extraction pass stored.

Each reads the extras of one network pass (:mod:`oodeval.features.passes`, settings in
:mod:`oodeval.features.pass_options`) and refuses a FeatureSet without it, naming the extraction
option that provides it (their peers' names, OpenOOD's ``odin``, ``mds_ensemble``, ``gram``,
``rankfeat``, ``dropout`` and pytorch-ood's ``ODIN``, ``MahalanobisODIN``, ``Gram``, ``RankFeat``,
``MCD``, are in :mod:`.peer_names`). A hyperparameter that shaped the pass (ODIN's T and eps, the mds noise)
defaults to None = the pass's recorded setting; an explicit value must match it. All are opt-in
(:class:`~oodeval.detectors.base.OptInDetector`), float64 (the ensemble's per-layer distances are
the ``mahalanobis`` detector's, in its default precision), higher = more in-distribution; where they
differ from the peers' releases, docs/detectors.md ("Methods that need the network") says how.
OpenOOD's methods since v1.5 follow at the end: the deep ensemble (members' logits of an ensemble
FeatureSet, :mod:`oodeval.features.ensemble`), AdaSCALE-A / -L and i-ODIN (their passes).
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral

import numpy as np

from ..errors import InputError
from ..features import FeatureSet
from ..features.pass_options import fit_digests, require_pass
from ..params import BOOLEAN, POSITIVE, SEED, Instance, Interval, Options, Real
from . import REGISTRY, register
from ._backend import Compute
from ._common import as64, chunks, energy, labelled, logsumexp_rows
from .mahalanobis import Mahalanobis
from .base import OptInDetector

__all__ = ["ODIN", "MahalanobisEnsemble", "Gram", "RankFeat", "MCDropout", "fit_layer_gaussians", "fit_layer_weights",
           "gram_deviations", "DeepEnsemble", "AdaScaleA", "AdaScaleL", "IODIN", "adascale_shift", "adascale_scale"]


class NetworkMethod(OptInDetector):
    """A method scoring the extras of the network pass ``pass_kind``; checks the pass is there first."""

    pass_kind = ""

    def _settings(self, x: FeatureSet) -> dict:
        return require_pass(x.meta, self.pass_kind, type(self).__name__)

    def fit(self, train: FeatureSet | None = None) -> NetworkMethod:
        if self.fit_needs and train is not None:
            self._settings(train)
        return super().fit(train)

    def score(self, x: FeatureSet) -> np.ndarray:
        self._settings(x)
        return super().score(x)

    def _matching(self, x: FeatureSet, name: str, setting: str) -> float:
        """The pass's recorded ``setting``, refused when the hyperparameter ``name`` says otherwise."""
        recorded = float(self._settings(x)[setting])
        mine = getattr(self, name)
        if mine is not None and float(mine) != recorded:
            raise InputError(f"{type(self).__name__}({name}={mine}): {x.meta.get('dataset')!r} holds the {self.pass_kind} pass with "
                             f"{setting}={recorded}; extract with that setting, or leave {name} unset (the pass's own)")
        return recorded


def _view(x: FeatureSet, logits: np.ndarray | None = None, features: np.ndarray | None = None) -> FeatureSet:
    """``x`` with other logits or features (a stored pass's arrays), labels and meta kept."""
    return FeatureSet(features=x.features if features is None else features, labels=x.labels,
                      logits=x.logits if logits is None else logits, meta=dict(x.meta))  # fmt: skip


@register("odin", tags=("logit", "network"))
class ODIN(NetworkMethod):
    """s = max_c softmax(f(x~) / T)_c, x~ = x - eps sign(grad_x CE(f(x) / T, argmax f(x))) / std.

    Liang, Li & Srikant, "Enhancing the reliability of out-of-distribution image detection in
    neural networks", ICLR 2018. f(x~) is the ``odin`` pass's ``odin/logits``; ``temperature`` (T)
    and ``noise`` (eps) are the pass's (OpenOOD v1.5 defaults T = 1000, eps = 0.0014, extract with
    ``--odin``). The softmax is float64 (:meth:`Compute.max_softmax`).
    """

    needs = ("extra:odin/logits",)
    pass_kind = "odin"
    constraints = {"temperature": (POSITIVE, None), "noise": (Interval(Real, 0, None), None)}

    def __init__(self, temperature: float | None = None, noise: float | None = None) -> None:
        self.temperature = temperature
        self.noise = noise

    def _score(self, x: FeatureSet) -> np.ndarray:
        t = self._matching(x, "temperature", "temperature")
        self._matching(x, "noise", "noise")
        self.resolved_ = {"temperature": t, "noise": float(self._settings(x)["noise"])}
        comp = Compute("float64")
        f = x.extras[f"{self.pass_kind}/logits"]
        return comp.map_rows(lambda a: comp.max_softmax(a / t), f, width=f.shape[1])


def fit_layer_gaussians(train: FeatureSet, layers: Sequence[str] | None = None) -> dict[str, Mahalanobis]:
    """Per stored ``mds/<layer>`` of ``train``: the ``mahalanobis`` detector (class means, tied
    covariance, pseudo-inverse; float64 fit) fitted on that layer's features with the true labels."""
    stored = [k[len("mds/") :] for k in sorted(train.extras) if k.startswith("mds/")]
    layers = list(layers) if layers is not None else stored
    missing = [n for n in layers if n not in stored]
    if missing:
        raise InputError(f"layers {missing} are not in {train.meta.get('dataset')!r}'s mds pass, which holds {stored}")
    return {n: Mahalanobis().fit(_view(train, features=np.asarray(train.extras[f"mds/{n}"]))) for n in layers}


@register("mahalanobis_ensemble", tags=("feature", "network"))
class MahalanobisEnsemble(NetworkMethod):
    """s = sum_l w_l M_l(x~_l), M_l = -min_c (h_l - mu_{l,c})' S_l^+ (h_l - mu_{l,c}).

    Lee, Lee, Lee & Shin, "A simple unified framework for detecting out-of-distribution samples and
    adversarial attacks", NeurIPS 2018: per layer l, class-conditional Gaussians with a tied
    covariance on the spatial means h_l of its feature maps (fitted on ID train with true labels,
    :func:`fit_layer_gaussians`), scored on the input x~_l perturbed towards the closest Gaussian
    with step ``noise`` (the ``mds`` pass, extract with ``--mds``; noise 0: the layer ensemble without
    preprocessing). ``layers``: which stored layers (default all: the model's stages); ``weights``
    w_l (default 1 each). The paper fits w by logistic regression on validation ID and OOD (or
    adversarial) data: :func:`fit_layer_weights`, then pass them as ``weights``. OpenOOD's scores
    are -1/2 of these distances (the same ranking for the same weights).
    """

    needs = ("extra:mds/*",)
    fit_needs = ("labels", "extra:mds/*")
    pass_kind = "mds"
    constraints = {"layers": (Instance(list, tuple), None), "weights": (Instance(list, tuple), None), "noise": (Interval(Real, 0, None), None)}

    def __init__(self, layers: Sequence[str] | None = None, weights: Sequence[float] | None = None, noise: float | None = None) -> None:
        self.layers = layers
        self.weights = weights
        self.noise = noise

    def _fit(self, train: FeatureSet) -> None:
        if float(self._settings(train)["noise"]) != 0:
            raise InputError("mahalanobis_ensemble fits on the clean ID-train features: extract ID train with --mds noise=0")
        self.gaussians_ = fit_layer_gaussians(train, self.layers)
        if self.weights is not None and len(self.weights) != len(self.gaussians_):
            raise InputError(f"mahalanobis_ensemble: {len(self.weights)} weights for {len(self.gaussians_)} layers {list(self.gaussians_)}")
        self.digest_ = fit_digests(train, list(self.gaussians_))

    def layer_scores(self, x: FeatureSet) -> np.ndarray:
        """(N, L): M_l of each layer, in the order of ``gaussians_``."""
        settings = self._settings(x)
        self._matching(x, "noise", "noise")
        recorded = settings.get("gaussians") or {}
        if float(settings["noise"]) > 0 and any(recorded.get(n) != d for n, d in self.digest_.items()):
            raise InputError(f"{x.meta.get('dataset')!r} was perturbed along the Gaussians of another ID-train set or layers "
                             f"(fit {settings.get('fit')}): extract it with fit= the ID-train set this detector fits on")
        missing = [n for n in self.gaussians_ if f"mds/{n}" not in x.extras]
        if missing:
            raise InputError(f"{x.meta.get('dataset')!r} lacks the mds layers {missing}; extract it with the same layers as ID train")
        return np.stack([g.score(_view(x, features=np.asarray(x.extras[f"mds/{n}"]))) for n, g in self.gaussians_.items()], axis=1)

    def _score(self, x: FeatureSet) -> np.ndarray:
        w = np.ones(len(self.gaussians_)) if self.weights is None else np.asarray(self.weights, dtype=np.float64)
        return self.layer_scores(x) @ w


def fit_layer_weights(id_scores: np.ndarray, ood_scores: np.ndarray) -> list[float]:
    """Layer weights w (one per column) by logistic regression of ID (1) vs OOD (0) on the layer
    scores of validation sets (``MahalanobisEnsemble.layer_scores``), as the paper (and OpenOOD's
    ``alpha_selector``, scikit-learn's ``LogisticRegressionCV``) does."""
    import warnings

    from sklearn.linear_model import LogisticRegressionCV

    data = np.concatenate([as64(id_scores), as64(ood_scores)])
    target = np.concatenate([np.ones(len(id_scores)), np.zeros(len(ood_scores))])
    with warnings.catch_warnings():  # scikit-learn 1.8 announces default changes (l1_ratios, attributes) that do not bind here
        warnings.simplefilter("ignore", FutureWarning)
        return LogisticRegressionCV(scoring="accuracy").fit(data, target).coef_.reshape(-1).tolist()


def gram_deviations(g: np.ndarray, mins: np.ndarray, maxs: np.ndarray) -> np.ndarray:
    """Per row of g (N, P, C): sum over p and c of relu(min - g) / |min + 1e-6| + relu(g - max) / |max + 1e-6|,
    the bounds (N, P, C) of each row's class (the releases' 1e-6)."""
    lo = np.maximum(mins - g, 0) / np.abs(mins + 1e-6)
    hi = np.maximum(g - maxs, 0) / np.abs(maxs + 1e-6)
    return (lo + hi).sum(axis=(1, 2))


@register("gram", tags=("feature", "network"))
class Gram(NetworkMethod):
    """s = -(sum_l delta_l(x) / E_l) / c(x), delta_l the deviation of the Gram rows from the class bounds.

    Sastry & Oore, "Detecting out-of-distribution examples with Gram matrices", ICML 2020. Per
    layer l and order p the ``gram`` pass (extract with ``--gram``) stores g = sign(G) |G|^(1/p), G
    the row sums of the p-th order Gram matrix. Fit: per class, the min and max of each entry over
    the ID-train rows assigned to it (``assign="prediction"``: by the argmax of the logits, as the
    paper and OpenOOD; ``"label"``: true labels, as pytorch-ood), less a seeded ``val_fraction`` of
    each class held out; E_l = the mean deviation of the held-out rows (1 when none or 0). Score:
    each row against the bounds of its predicted class (:func:`gram_deviations`), divided by its
    maximum softmax probability c(x) when ``by_confidence`` (the paper's code and OpenOOD; pytorch-ood
    does not). A row predicted into a class no ID-train row was assigned to is refused.
    """

    needs = ("logits", "extra:gram/*")
    fit_needs = ("logits", "extra:gram/*")
    pass_kind = "gram"
    constraints = {"val_fraction": Interval(Real, 0, 1, closed="left"), "seed": SEED, "assign": Options("prediction", "label"),
                   "by_confidence": BOOLEAN}  # fmt: skip

    def __init__(self, val_fraction: float = 0.1, seed: int = 0, assign: str = "prediction", by_confidence: bool = True) -> None:
        self.val_fraction = val_fraction
        self.seed = seed
        self.assign = assign
        self.by_confidence = by_confidence

    def _fit(self, train: FeatureSet) -> None:
        self.layers_ = [k[len("gram/") :] for k in sorted(train.extras) if k.startswith("gram/")]
        if self.assign == "label":
            idx, _ = labelled(train.labels, "gram")
            cls = np.asarray(train.labels)
        else:
            idx, cls = np.arange(len(train)), np.asarray(train.logits).argmax(axis=1)
        rng = np.random.default_rng(self.seed)
        fit_rows, val_rows = {}, {}
        for c in np.unique(cls[idx]):
            rows = idx[cls[idx] == c]
            perm = rng.permutation(rows.size)
            n_val = int(self.val_fraction * rows.size)
            fit_rows[int(c)], val_rows[int(c)] = np.sort(rows[perm[n_val:]]), np.sort(rows[perm[:n_val]])
        n_classes = np.asarray(train.logits).shape[1]
        self.classes_ = np.array(sorted(fit_rows))
        self.mins_, self.maxs_ = {}, {}
        for name in self.layers_:
            g = train.extras[f"gram/{name}"]  # min and max are exact in the stored precision; one class's rows at a time
            mins = np.full((n_classes, *g.shape[1:]), np.nan)
            maxs = np.full_like(mins, np.nan)
            for c, rows in fit_rows.items():
                block = np.asarray(g[rows])
                mins[c], maxs[c] = block.min(axis=0), block.max(axis=0)
            self.mins_[name], self.maxs_[name] = mins, maxs
        self.norms_ = np.ones(len(self.layers_))
        val = np.concatenate([val_rows[c] for c in sorted(val_rows)]).astype(int)
        self.val_rows_ = val
        if val.size:
            conf = self._confidence(np.asarray(train.logits)[val])
            for i, name in enumerate(self.layers_):
                d = self._deviations(train.extras[f"gram/{name}"], name, cls[val], val) / conf
                if d.mean() > 0:
                    self.norms_[i] = d.mean()

    def _deviations(self, g: np.ndarray, name: str, cls: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """:func:`gram_deviations` of ``g``'s rows (all, or ``rows``) against the bounds of ``cls``, by chunks in float64."""
        n = len(cls)
        out = np.empty(n)
        for part in chunks(n, int(np.prod(g.shape[1:]))):
            block = as64(g[part] if rows is None else g[rows[part]])
            out[part] = gram_deviations(block, self.mins_[name][cls[part]], self.maxs_[name][cls[part]])
        return out

    def _confidence(self, logits: np.ndarray) -> np.ndarray:
        return Compute("float64").max_softmax(as64(logits)) if self.by_confidence else np.ones(len(logits))

    def _score(self, x: FeatureSet) -> np.ndarray:
        missing = [n for n in self.layers_ if f"gram/{n}" not in x.extras]
        if missing:
            raise InputError(f"{x.meta.get('dataset')!r} lacks the gram layers {missing}; extract it with the same layers as ID train")
        logits = np.asarray(x.logits)
        pred = logits.argmax(axis=1)
        unbounded = ~np.isin(pred, self.classes_)
        if unbounded.any():
            raise InputError(f"gram: {int(unbounded.sum())} of {len(x)} rows of {x.meta.get('dataset')!r} are predicted into classes "
                             f"{sorted(set(pred[unbounded].tolist()))} that no ID-train row was assigned to; use assign='label'")
        total = np.zeros(len(x))
        for i, name in enumerate(self.layers_):
            total += self._deviations(x.extras[f"gram/{name}"], name, pred) / self.norms_[i]
        return -total / self._confidence(logits)


@register("rankfeat", tags=("logit", "network"))
class RankFeat(NetworkMethod):
    """s = T logsumexp(mean_b f_b / T), f_b the logits with the rank-1 part of block b's features removed.

    Song, Sebe & Wang, "RankFeat: Rank-1 feature removal for out-of-distribution detection",
    NeurIPS 2022. The ``rankfeat`` pass (``--rankfeat``) stores f_b for each block (default the
    model's last two stages, the paper's block 3 + block 4); the logits of the blocks in ``blocks``
    (default all stored) are averaged, then the energy is taken, as OpenOOD v1.5's fusion
    (T = ``temperature`` = 1). One block is the paper's single-block RankFeat.
    """

    needs = ("extra:rankfeat/*",)
    pass_kind = "rankfeat"
    constraints = {"blocks": (Instance(list, tuple), None), "temperature": POSITIVE}

    def __init__(self, blocks: Sequence[str] | None = None, temperature: float = 1.0) -> None:
        self.blocks = blocks
        self.temperature = temperature

    def _score(self, x: FeatureSet) -> np.ndarray:
        stored = [k[len("rankfeat/") :] for k in sorted(x.extras) if k.startswith("rankfeat/")]
        blocks = list(self.blocks) if self.blocks is not None else stored
        missing = [b for b in blocks if b not in stored]
        if missing or not blocks:
            raise InputError(f"rankfeat blocks {missing or blocks} are not in {x.meta.get('dataset')!r}, which holds {stored}")
        fused = sum(as64(x.extras[f"rankfeat/{b}"]) for b in blocks) / len(blocks)
        return energy(fused, float(self.temperature))


@register("mc_dropout", tags=("logit", "network"))
class MCDropout(NetworkMethod):
    """Monte-Carlo dropout (Gal & Ghahramani, ICML 2016) over the ``mcd`` pass's T stochastic forwards.

    ``mode="mean"``: s = max_c (1/T) sum_t softmax(f_t)_c, the predictive distribution's maximum
    (the paper; pytorch-ood's ``MCD(mode="mean")``); ``"var"``: s = -(1/C) sum_c var_t softmax(f_t)_c
    (pytorch-ood's default ``mode="var"``); ``"logits"``: s = max_c softmax((1/T) sum_t f_t)_c (OpenOOD
    v1.5's ``dropout``). Extract with ``--mcd`` (OpenOOD's T = 5, p = 0.5 on the classifier's input).
    """

    needs = ("extra:mcd/*",)
    pass_kind = "mcd"
    constraints = {"mode": Options("mean", "var", "logits")}

    def __init__(self, mode: str = "mean") -> None:
        self.mode = mode

    def _score(self, x: FeatureSet) -> np.ndarray:
        if self.mode == "mean":
            return as64(x.extras["mcd/probs"]).max(axis=1)
        if self.mode == "var":
            return -as64(x.extras["mcd/var"])
        return Compute("float64").max_softmax(as64(x.extras["mcd/logits"]))  # "logits" (constraints allow no other)


#: pytorch-ood 0.4.0's ``MultiMahalanobis`` (``pytorch_ood/detector/mmahalanobis.py``: per layer the
#: spatial mean of its maps, class means and a tied covariance, alpha-weighted sum of the layers'
#: closest-class distances, no input preprocessing) is ``mahalanobis_ensemble`` on an mds pass with
#: noise 0: its outlier score is 1/(2N) of this one's negation (it inverts the unnormalised scatter
#: plus 1e-6 I, this one the maximum-likelihood covariance's pseudo-inverse), the same ranking for the
#: same weights (tests/test_since_paper.py)
REGISTRY.alias("MultiMahalanobis", "mahalanobis_ensemble", "pytorch-ood 0.4, an mds pass with noise=0", tags=("since-paper",))


@register("deep_ensemble", tags=("logit", "network", "openood", "since-paper"))
class DeepEnsemble(OptInDetector):
    """A deep ensemble of M models trained on the same data, scored as one detector.

    ``mode="logits"`` (default): s = max_c softmax((1/M) sum_m f_m)_c, the mean of the members'
    logits f_m through the maximum softmax, as OpenOOD's ``ensemble`` postprocessor
    (``openood/postprocessors/ensemble_postprocessor.py`` at
    3c35632ee91b54b09d1f085d04f94744cece7d0b; ``configs/postprocessors/ensemble.yml``: every listed
    checkpoint is a member, 5 there). ``"probs"``: s = max_c (1/M) sum_m softmax(f_m)_c, the mean
    predictive distribution of Lakshminarayanan, Pritzel & Blundell (NeurIPS 2017), whose form
    OpenOOD's mean of logits departs from. Reads an ensemble FeatureSet
    (:func:`oodeval.features.ensemble.ensemble_featureset`, or an ``ensemble = [...]`` model
    table in an experiment), whose members are recorded in ``resolved_`` (the results'
    ``hyperparameters_resolved``); every set scored after a fit must have the same members
    (names and models; the first set scored fixes them). float64.
    """

    needs = ("extra:ensemble/*",)
    constraints = {"mode": Options("logits", "probs")}

    def __init__(self, mode: str = "logits") -> None:
        self.mode = mode

    @staticmethod
    def _members(x: FeatureSet) -> list[dict]:
        return [{k: m.get(k) for k in ("name", "model", "weights_hash")} for m in (x.meta.get("ensemble") or {}).get("members", [])]

    def _score(self, x: FeatureSet) -> np.ndarray:
        from ..features.ensemble import member_logits

        logits = member_logits(x)
        members = self._members(x)
        known = getattr(self, "resolved_", {}).get("members")
        if known is not None and known != members:
            raise InputError(f"deep_ensemble: {x.name!r} holds the members {[m['name'] for m in members]} ({[m['model'] for m in members]}), "
                             f"the sets scored before {[m['name'] for m in known]} ({[m['model'] for m in known]})")
        self.resolved_ = {"members": members}
        if self.mode == "logits":
            return Compute("float64").max_softmax(sum(as64(f) for f in logits) / len(logits))
        total = np.zeros(logits[0].shape)
        for f in logits:
            e = np.exp(as64(f) - as64(f).max(axis=1, keepdims=True))
            total += e / e.sum(axis=1, keepdims=True)
        return total.max(axis=1) / len(logits)


def _top_sum(a: np.ndarray, z: np.ndarray, k: int) -> np.ndarray:
    """Per row, the sum of ``a`` at the k largest entries of ``z`` (float64; 0 for k = 0)."""
    if k == 0:
        return np.zeros(len(z))
    idx = np.argpartition(z, z.shape[1] - k, axis=1)[:, z.shape[1] - k :]
    return np.take_along_axis(a, idx, axis=1).sum(axis=1)


def adascale_shift(z: np.ndarray, zp: np.ndarray, k1: int, k2: int, lmbda: float) -> np.ndarray:
    """Q' = sum_{top k1 of z} relu(z~) + lmbda sum_{top k2 of z} |z - z~| per row (float64), z~ the
    feature of the perturbed input: AdaSCALE's estimate of how far a sample's top activations move."""
    z, zp = as64(z), as64(zp)
    return _top_sum(np.maximum(zp, 0), z, k1) + lmbda * _top_sum(np.abs(z - zp), z, k2)


def adascale_scale(z: np.ndarray, percentiles: np.ndarray) -> np.ndarray:
    """r = sum relu(z) / (sum of the k_i largest of relu(z)), k_i = D - round(D p_i / 100) per row (float64)."""
    a = np.maximum(as64(z), 0)
    d = a.shape[1]
    k = d - np.round(d * percentiles / 100.0).astype(np.int64)
    top = -np.sort(-a, axis=1)
    kept = np.take_along_axis(np.cumsum(top, axis=1), (k - 1)[:, None], axis=1)[:, 0]
    total = a.sum(axis=1)
    return np.divide(total, kept, out=np.zeros_like(total), where=kept != 0)


class _AdaScale(NetworkMethod):
    """AdaSCALE (Regmi, arXiv 2503.08023): SCALE with a per-sample percentile.

    Per sample, Q' = :func:`adascale_shift` of its feature z and the feature z~ of the ``adascale``
    pass (extract with ``--adascale``: the int(o C H W) input values of smallest gradient magnitude
    of the maximum logit moved by 0.5 sign(grad)); p = p_min + (1 - F(Q')) (p_max - p_min), F the
    empirical CDF (fraction <=) of Q' over a seeded ``num_samples`` rows of the fit set; r =
    :func:`adascale_scale` (z, p). AdaSCALE-A: s = logsumexp(W (z e^r) + b); AdaSCALE-L: s =
    logsumexp(r^2 (W z + b)). k1, k2 are percentages of the feature dimension D (int(D k / 100)
    entries). OpenOOD's ``adascale_a`` / ``adascale_l`` (``openood/postprocessors/adascale_postprocessor.py``
    and ``openood/networks/adascale_net.py`` at 3c35632ee91b54b09d1f085d04f94744cece7d0b), defaults
    from ``configs/postprocessors/adascale_{a,l}.yml``: percentile (75, 85), k1 5, k2 1, lmbda 10,
    o 0.05, num_samples 5000. OpenOOD fits on ID validation rows with an unseeded draw; here on the
    fit set given, with ``seed``. The top-k of z break ties by position (torch's topk may pick other
    tied entries). float64.
    """

    needs = ("features", "head", "extra:adascale/features")
    fit_needs = ("features", "extra:adascale/features")
    pass_kind = "adascale"
    logit_scaling = False
    constraints = {"percentile": Instance(list, tuple), "k1": Interval(Real, 0, 100), "k2": Interval(Real, 0, 100),
                   "lmbda": Interval(Real, 0, None), "o": (Interval(Real, 0, 1, closed="right"), None),
                   "num_samples": Interval(Integral, 1, None), "seed": SEED}  # fmt: skip

    def __init__(self, percentile: Sequence[float] = (75.0, 85.0), k1: float = 5.0, k2: float = 1.0, lmbda: float = 10.0,
                 o: float | None = None, num_samples: int = 5000, seed: int = 0) -> None:  # fmt: skip
        self.percentile = percentile
        self.k1 = k1
        self.k2 = k2
        self.lmbda = lmbda
        self.o = o
        self.num_samples = num_samples
        self.seed = seed

    def _fit(self, train: FeatureSet) -> None:
        p = [float(v) for v in self.percentile]
        d = train.features.shape[1]
        if len(p) != 2 or not 0 < p[0] <= p[1] < 100 or d - round(d * p[1] / 100) < 1:
            raise InputError(f"{type(self).__name__}: percentile must be [min, max] with 0 < min <= max < 100 keeping an entry "
                             f"of the {d}-d feature, got {list(self.percentile)}")
        self.o_ = self._matching(train, "o", "o")
        n = len(train)
        rows = np.sort(np.random.default_rng(self.seed).permutation(n)[: self.num_samples]) if n > self.num_samples else np.arange(n)
        self.k1_, self.k2_ = int(d * self.k1 / 100), int(d * self.k2 / 100)
        self.reference_ = np.sort(adascale_shift(train.features[rows], train.extras["adascale/features"][rows], self.k1_, self.k2_, self.lmbda))

    def percentiles(self, x: FeatureSet) -> np.ndarray:
        """p per row of ``x`` (float64)."""
        if self._matching(x, "o", "o") != self.o_:
            raise InputError(f"{type(self).__name__}: {x.name!r} holds the adascale pass with o={self.o_} unlike the fit set; extract both alike")
        q = adascale_shift(x.features, x.extras["adascale/features"], self.k1_, self.k2_, self.lmbda)
        cdf = np.searchsorted(self.reference_, q, side="right") / len(self.reference_)
        low, high = (float(v) for v in self.percentile)
        return low + (1 - cdf) * (high - low)

    def _score(self, x: FeatureSet) -> np.ndarray:
        z, w, b = as64(x.features), as64(x.weight), as64(x.bias)
        r = adascale_scale(z, self.percentiles(x))
        if self.logit_scaling:
            return logsumexp_rows((z @ w.T + b) * (r**2)[:, None])
        return logsumexp_rows((z * np.exp(r)[:, None]) @ w.T + b)


@register("adascale_a", tags=("activation", "network", "openood", "since-paper"))
class AdaScaleA(_AdaScale):
    """AdaSCALE-A: s = logsumexp(W (z e^r) + b), the feature scaled by e^r (see :class:`_AdaScale`)."""


@register("adascale_l", tags=("activation", "network", "openood", "since-paper"))
class AdaScaleL(_AdaScale):
    """AdaSCALE-L: s = logsumexp(r^2 (W z + b)), the logits scaled by r^2 (see :class:`_AdaScale`)."""
    logit_scaling = True


@register("iodin", tags=("logit", "network", "openood", "since-paper"))
class IODIN(ODIN):
    """i-ODIN: s = max_c softmax(f(x~) / T)_c, x~ = x - eps s_j / std_j at the single input value j of
    largest |grad_x CE(f(x) / T, argmax f(x))|, s_j = +1 where that gradient is >= 0 else -1.

    arXiv 2411.10794; OpenOOD's ``iodin`` (``openood/postprocessors/iodin_postprocessor.py`` at
    3c35632ee91b54b09d1f085d04f94744cece7d0b; ``configs/postprocessors/iodin.yml``: T = 1000, eps =
    0.0014). f(x~) is the ``iodin`` pass's ``iodin/logits`` (extract with ``--iodin``); ``temperature``
    and ``noise`` default to the pass's, as ODIN's (its hyperparameters and score, on this pass). The softmax is float64.
    """

    needs = ("extra:iodin/logits",)
    pass_kind = "iodin"

