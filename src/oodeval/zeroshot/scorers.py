"""Zero-shot VLM OOD scorers on cached embeddings (paper Sec. 4.1, App. F; docs/zeroshot.md).

Every score starts from the similarity logits l_c(x) = h(x)' t_c / tau of the l2-normalised image
embedding h(x) and label embeddings t_c, tau = 0.01 (NegLabel), so a(x, t) = exp(l). All maths is
float64 with log-sum-exp; nothing is exponentiated before its maximum is subtracted. Every scorer
returns float64 (N,), higher = more in-distribution.

Logit space (ID names only): mcm = max_c p(c|x) (MCM, Ming et al. 2022); maxlogit = max_c l_c;
energy = logsumexp_c l_c (Liu et al. 2020, T = 1 on the tau-scaled logits); gen = -sum over the top-M
of p^g (1 - p)^g (GEN, Liu et al. 2023; g = 0.1, M = 100); entropy = sum_c p log p (negative
entropy); margin = l_(1) - l_(2) (gap between the two largest logits; ``space="prob"`` uses
p_(1) - p_(2)); gl_mcm = mcm + lambda * max over patches of max_c softmax of the patch logits
(GL-MCM, Miyai et al. 2025; lambda = 1; patch features from the value-path pass, or the local term as the
readout stored at extraction, ``features.patchreadout``).

Vocabulary based (ID names + M negatives t^_m): neglabel = Eq. 3,
s = sum_c a(x,t_c) / (sum_c a(x,t_c) + sum_m a(x,t^_m)), with NegLabel's grouping (Jiang et al. 2024,
released code): the last M mod G negatives are dropped, the rest seeded-randomly permuted and split
into G equal groups, Eq. 3 is evaluated with each group and the G scores are averaged (G = 100 in the
released ImageNet config; G = 1 is plain Eq. 3). eoe = max_c p_c - beta * max_m p_m with p the
softmax over ID and negative logits together (EOE, Cao et al. 2024, released score; beta = 0.25).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from scipy.special import log_softmax, logsumexp
from sklearn.base import BaseEstimator

from .. import _arrays
from ..detectors.base import as_scores
from ..errors import InputError
from ..features import FeatureSet
from ..features.stream import iter_chunks
from ..params import POSITIVE, SEED, Checked, Integral, Interval, Options, Real
from ..registry import Registry

__all__ = [
    "ZeroShotScorer", "REGISTRY", "ZS_PREFIX", "register", "scorer_names", "create_scorer", "score_zeroshot", "similarity_logits",
    "grouped_share", "negative_groups", "share_of_groups", "ZeroShotMCM", "ZeroShotMaxLogit", "ZeroShotEnergy", "ZeroShotGEN", "ZeroShotEntropy", "Margin", "GLMCM", "NegLabel", "EOE",
]  # fmt: skip

REGISTRY = Registry("zero-shot scorer", "oodeval.zeroshot_scorers")
#: how a zero-shot scorer is shown where a post-hoc detector of the same name is shown too (mcm,
#: maxlogit, energy, gen: different methods under one registry name); stored names stay plain
ZS_PREFIX = "zs:"


def register(name: str, order: int | None = None, vocabulary: bool = False):
    """Class decorator: register a :class:`ZeroShotScorer` with tags "zeroshot" and "logit" (ID
    names only) or, with ``vocabulary``, "needs-vocabulary" (scored against negatives too)."""
    add = REGISTRY.register(name, tags=("zeroshot", "needs-vocabulary" if vocabulary else "logit"), order=order)

    def deco(cls):
        cls.uses_negatives = vocabulary
        return add(cls)

    return deco


def _check_unit(name: str, x: np.ndarray, ndim: int) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != ndim:
        raise InputError(f"{name} must have {ndim} dimensions, got shape {x.shape}")
    bad = ~np.isfinite(x)
    if bad.any():
        raise InputError(f"{name} has {int(bad.sum())} non-finite values")
    norms = np.linalg.norm(x, axis=-1)
    off = np.abs(norms - 1.0) > 1e-3
    if off.any():
        raise InputError(f"{name}: {int(off.sum())} of {norms.size} rows are not l2-normalised (norm != 1)")
    return x


def similarity_logits(image: np.ndarray, text: np.ndarray, tau: float = 0.01) -> np.ndarray:
    """l = image @ text.T / tau in float64. image (..., E) and text (C, E) must be l2-normalised."""
    if not tau > 0:
        raise InputError(f"tau must be > 0, got {tau}")
    image = _check_unit("image embeddings", image, np.ndim(image))
    text = _check_unit("text embeddings", text, 2)
    if image.shape[-1] != text.shape[1]:
        raise InputError(f"image embeddings have dim {image.shape[-1]}, text embeddings {text.shape[1]}")
    if text.shape[0] == 0:
        raise InputError("no text embeddings (0 labels)")
    return image @ text.T / tau


def _max_softmax(logits: np.ndarray) -> np.ndarray:
    """max_c softmax(l)_c = exp(max l - logsumexp l), along the last axis."""
    return np.exp(logits.max(axis=-1) - logsumexp(logits, axis=-1))


def _prepare(name: str, x: np.ndarray, normalize: bool) -> np.ndarray:
    """float64 rows of ``x``, l2-normalised first when ``normalize`` (zero rows refused), then checked unit."""
    x = np.asarray(x, dtype=np.float64)
    if normalize:
        bad = ~np.isfinite(x)
        if bad.any():
            raise InputError(f"{name} has {int(bad.sum())} non-finite values")
        norms = np.linalg.norm(x, axis=-1, keepdims=True)
        if (norms == 0).any():
            raise InputError(f"{name}: {int((norms == 0).sum())} rows have norm 0 and cannot be normalised")
        x = x / norms
    return _check_unit(name, x, x.ndim)


class ZeroShotScorer(Checked, BaseEstimator):
    """Base class: constructor = hyperparameters; ``score(image, id_text, negatives=None, normalize=False)``.

    image: a FeatureSet whose ``features`` are l2-normalised image embeddings (N, E), or that array.
    id_text: (C, E) l2-normalised ID label embeddings; negatives: (M, E) or None. ``normalize``
    l2-normalises image rows (and patch features) chunk by chunk instead of requiring unit rows.
    Images are streamed in row chunks (``features.stream.iter_chunks``: a memory-mapped store is read with
    file reads), so peak memory is one chunk's float64 work arrays plus the text embeddings,
    whatever N. Rows per chunk: ``chunk_rows`` if set, else ``CHUNK_ELEMENTS`` / the per-row width.
    Hyperparameters are checked against ``constraints`` when built (:mod:`oodeval.params`).
    """

    param_kind = "zero-shot scorer"

    needs: ClassVar[tuple[str, ...]] = ("features",)
    #: set by the registration (tag "needs-vocabulary")
    uses_negatives: ClassVar[bool] = False
    #: the paper's name in reports (``GL-MCM``), as :attr:`oodeval.detectors.base.Detector.label`
    label: ClassVar[str] = ""
    chunk_rows: int | None = None

    def _row_width(self, image: FeatureSet, n_labels: int) -> int:
        """float64 values one image row needs at once (embedding + its logits)."""
        return int(image.features.shape[1]) + n_labels

    def score(self, image: FeatureSet | np.ndarray, id_text: np.ndarray, negatives: np.ndarray | None = None,
              normalize: bool = False) -> np.ndarray:
        """float64 (N,) scores, higher = more in-distribution."""
        who = type(self).__name__
        if isinstance(image, FeatureSet):
            image.require(self.needs, who)
        else:
            if self.needs != ("features",):
                raise InputError(f"{who} needs {self.needs}: pass a FeatureSet, not an array")
            image = FeatureSet(features=np.asarray(image))
        if negatives is not None and not self.uses_negatives:
            raise InputError(f"{who} uses the ID names only; negatives were given ({len(negatives)})")
        self.check_params()
        id_text = _check_unit("text embeddings", id_text, 2)
        if id_text.shape[0] == 0:
            raise InputError("no text embeddings (0 labels)")
        if negatives is not None:
            negatives = np.asarray(negatives, dtype=np.float64)
            negatives = (negatives.reshape(0, image.features.shape[1]) if negatives.size == 0
                         else _check_unit("negative text embeddings", negatives, 2))
        for name, t in (("text", id_text), ("negative text", negatives)):
            if t is not None and len(t) and t.shape[1] != image.features.shape[1]:
                raise InputError(f"image embeddings have dim {image.features.shape[1]}, {name} embeddings {t.shape[1]}")
        n = len(image)
        extras = [need[len("extra:") :] for need in self.needs if need.startswith("extra:")]
        arrays = {"features": image.features, **{k: image.extras[k] for k in extras}}
        n_labels = len(id_text) + (0 if negatives is None else len(negatives))
        rows = self.chunk_rows or max(1, _arrays.CHUNK_ELEMENTS // max(1, self._row_width(image, n_labels)))
        out = np.empty(n)
        for part, chunk in iter_chunks(arrays, rows):
            feats = _prepare("image embeddings", chunk.pop("features"), normalize)
            ex = {k: _prepare(k, v, normalize) for k, v in chunk.items()}
            out[part] = self._score(FeatureSet(features=feats, extras=ex), id_text, negatives)
        return as_scores(out, n, who)

    def _score(self, image: FeatureSet, id_text: np.ndarray, negatives: np.ndarray | None) -> np.ndarray:
        """Scores of one chunk: float64 unit-norm ``image`` rows, validated float64 label embeddings."""
        raise NotImplementedError


def _logits(image: np.ndarray, text: np.ndarray, tau: float) -> np.ndarray:
    """image @ text.T / tau of already validated float64 arrays."""
    return image @ text.T / tau


@register("mcm", 1)
class ZeroShotMCM(ZeroShotScorer):
    """max_c softmax_c(h't_c / tau) (MCM)."""

    label = "MCM"
    constraints = {"tau": POSITIVE}

    def __init__(self, tau: float = 0.01) -> None:
        self.tau = tau

    def _score(self, image, id_text, negatives):
        return _max_softmax(_logits(image.features, id_text, self.tau))


@register("maxlogit", 2)
class ZeroShotMaxLogit(ZeroShotScorer):
    """max_c h't_c / tau."""

    label = "MaxLogit"
    constraints = {"tau": POSITIVE}

    def __init__(self, tau: float = 0.01) -> None:
        self.tau = tau

    def _score(self, image, id_text, negatives):
        return _logits(image.features, id_text, self.tau).max(axis=1)


@register("energy", 3)
class ZeroShotEnergy(ZeroShotScorer):
    """T * logsumexp_c(l_c / T) on the tau-scaled logits (T = 1)."""

    label = "Energy"
    constraints = {"tau": POSITIVE, "temperature": POSITIVE}

    def __init__(self, tau: float = 0.01, temperature: float = 1.0) -> None:
        self.tau = tau
        self.temperature = temperature

    def _score(self, image, id_text, negatives):
        logits = _logits(image.features, id_text, self.tau)
        return self.temperature * logsumexp(logits / self.temperature, axis=1)


@register("gen", 4)
class ZeroShotGEN(ZeroShotScorer):
    """-sum over the top-M probabilities of p^g (1-p)^g (GEN; g = 0.1, M = 100, capped at C)."""

    label = "GEN"
    constraints = {"tau": POSITIVE, "gamma": POSITIVE, "top_m": Interval(Integral, 1, None)}

    def __init__(self, tau: float = 0.01, gamma: float = 0.1, top_m: int = 100) -> None:
        self.tau = tau
        self.gamma = gamma
        self.top_m = top_m

    def _score(self, image, id_text, negatives):
        logits = _logits(image.features, id_text, self.tau)
        m = min(int(self.top_m), logits.shape[1])
        lse = logsumexp(logits, axis=1, keepdims=True)
        top = np.exp(-np.sort(-logits, axis=1)[:, :m] - lse)
        rest = 1.0 - top
        if logits.shape[1] > 1:  # 1 - p_max without cancellation: the mass of all other classes
            others = logits.copy()
            others[np.arange(len(logits)), logits.argmax(axis=1)] = -np.inf
            rest[:, 0] = np.exp(logsumexp(others, axis=1) - lse[:, 0])
        return -np.sum(top**self.gamma * rest**self.gamma, axis=1)


@register("entropy", 5)
class ZeroShotEntropy(ZeroShotScorer):
    """Negative entropy of the ID posterior, sum_c p log p (0 for a one-hot posterior)."""

    label = "Entropy"
    constraints = {"tau": POSITIVE}

    def __init__(self, tau: float = 0.01) -> None:
        self.tau = tau

    def _score(self, image, id_text, negatives):
        logp = log_softmax(_logits(image.features, id_text, self.tau), axis=1)
        return np.sum(np.exp(logp) * logp, axis=1)


@register("margin", 6)
class Margin(ZeroShotScorer):
    """Gap between the two largest logits (``space="logit"``) or probabilities (``space="prob"``)."""

    label = "Margin"
    constraints = {"tau": POSITIVE, "space": Options("logit", "prob")}

    def __init__(self, tau: float = 0.01, space: str = "logit") -> None:
        self.tau = tau
        self.space = space

    def _score(self, image, id_text, negatives):
        logits = _logits(image.features, id_text, self.tau)
        if logits.shape[1] < 2:
            raise InputError("margin needs at least 2 ID labels")
        if self.space == "prob":
            logits = np.exp(log_softmax(logits, axis=1))
        top2 = -np.partition(-logits, 1, axis=1)[:, :2]
        return top2[:, 0] - top2[:, 1]


@register("gl_mcm", 7)
class GLMCM(ZeroShotScorer):
    """MCM + lambda * max_patches max_c softmax(patch logits) (GL-MCM; lambda = 1).

    The local term comes from the readout stored at extraction for these label embeddings and tau
    (``extras["patch_readout/..."]``, ``features.patchreadout``; computed on float64-renormalised tokens,
    as ``normalize=True`` does), else from ``extras["patch_features"]`` (N, P, E), l2-normalised, from the
    value-path pass. Readouts for other labels or another tau only are refused (ValueError).
    """

    label = "GL-MCM"

    needs = ("features", "extra:patch_features")

    constraints = {"tau": POSITIVE, "lam": Interval(Real, 0, None)}

    def __init__(self, tau: float = 0.01, lam: float = 1.0) -> None:
        self.tau = tau
        self.lam = lam

    def _row_width(self, image: FeatureSet, n_labels: int) -> int:
        p, e = image.extras["patch_features"].shape[1:3]
        return (p + 1) * (e + n_labels)

    def score(self, image, id_text, negatives=None, normalize=False):
        from ..features.patchreadout import has_patch_data, stored_readout

        if isinstance(image, FeatureSet):
            if not has_patch_data(image):
                src = image.meta.get("dataset", "this FeatureSet")
                raise InputError(f"gl_mcm needs patch features, which {src} does not have: extract the VLM with "
                                 "patch_features (`oodeval extract --patch-features`, `patch_features = true` in a grid)")
            self.check_params()
            local = stored_readout(image, _check_unit("text embeddings", id_text, 2), self.tau)
            if local is not None:
                if negatives is not None:
                    raise InputError(f"GLMCM uses the ID names only; negatives were given ({len(negatives)})")
                mcm = ZeroShotMCM(self.tau)
                mcm.chunk_rows = self.chunk_rows
                glob = mcm.score(FeatureSet(features=image.features), id_text, normalize=normalize)
                return as_scores(glob + self.lam * local, len(image), type(self).__name__)
        return super().score(image, id_text, negatives, normalize)

    def _score(self, image, id_text, negatives):
        glob = _max_softmax(_logits(image.features, id_text, self.tau))
        patches = image.extras["patch_features"]
        if patches.ndim != 3 or patches.shape[0] != len(image):
            raise InputError(f"patch_features must be (N, P, E) with N={len(image)}, got {patches.shape}")
        local = _max_softmax(_logits(patches, id_text, self.tau)).max(axis=1)
        return glob + self.lam * local


def _log_share(lse_id: np.ndarray, lse_neg: np.ndarray) -> np.ndarray:
    """log of sum_ID a / (sum_ID a + sum_neg a) from the two log-sums."""
    return lse_id - np.logaddexp(lse_id, lse_neg)


def grouped_share(id_logits: np.ndarray, neg_logits: np.ndarray, n_groups: int, seed: int) -> np.ndarray:
    """NegLabel's grouped Eq. 3 of logits (N, C) and (N, M): the last M mod G negatives dropped, the
    rest permuted with ``numpy.random.default_rng(seed)`` and split into G = min(n_groups, M) equal
    groups; the mean over groups of sum_ID a / (sum_ID a + sum_group a). 1 where M = 0."""
    m = neg_logits.shape[1]
    if m == 0:
        return np.ones(len(id_logits))
    groups, order = negative_groups(m, n_groups, seed)
    grouped = neg_logits[:, : len(order)][:, order].reshape(len(neg_logits), groups, len(order) // groups)
    return share_of_groups(id_logits, grouped)


def negative_groups(m: int, n_groups: int, seed: int) -> tuple[int, np.ndarray]:
    """NegLabel's grouping of M >= 1 negatives: G = min(n_groups, M), and the order of the kept
    M - M mod G negatives (``default_rng(seed).permutation``) whose consecutive runs of M // G are the groups."""
    groups = min(int(n_groups), m)
    return groups, np.random.default_rng(seed).permutation(m - m % groups)


def share_of_groups(id_logits: np.ndarray, grouped: np.ndarray) -> np.ndarray:
    """Mean over groups of sum_ID a / (sum_ID a + sum_group a), ID logits (N, C), grouped negative logits (N, G, M/G)."""
    return np.exp(_log_share(_lse(id_logits)[:, None], _lse(grouped))).mean(axis=1)


def _lse(a: np.ndarray) -> np.ndarray:
    """log sum exp over the last axis of finite float64 logits, the maximum subtracted first (scipy's
    ``logsumexp`` without its input checks and copies: the same sums, a third of the time here)."""
    top = a.max(axis=-1)
    return top + np.log(np.exp(a - top[..., None]).sum(axis=-1))


@register("neglabel", 8, vocabulary=True)
class NegLabel(ZeroShotScorer):
    """Eq. 3 with NegLabel's grouping (n_groups = 100, seed = 0). No negatives: the score is 1.

    The last M mod G negatives (in vocabulary order, i.e. the most ID-like after NegMining) are
    dropped, the rest permuted with ``numpy.random.default_rng(seed)`` and split into G groups of
    equal size; when M < G every negative is its own group (G = M).
    """

    label = "NegLabel"
    constraints = {"tau": POSITIVE, "n_groups": Interval(Integral, 1, None), "seed": SEED}

    def __init__(self, tau: float = 0.01, n_groups: int = 100, seed: int = 0) -> None:
        self.tau = tau
        self.n_groups = n_groups
        self.seed = seed

    def _score(self, image, id_text, negatives):
        id_logits = _logits(image.features, id_text, self.tau)
        if negatives is None or len(negatives) == 0:
            return np.ones(len(id_logits))
        return grouped_share(id_logits, _logits(image.features, negatives, self.tau), self.n_groups, self.seed)


@register("eoe", 9, vocabulary=True)
class EOE(ZeroShotScorer):
    """max_ID p - beta * max_neg p, p = softmax over ID and negative logits (EOE; beta = 0.25).

    Without negatives it is MCM.
    """

    label = "EOE"
    constraints = {"tau": POSITIVE, "beta": Interval(Real, 0, None)}

    def __init__(self, tau: float = 0.01, beta: float = 0.25) -> None:
        self.tau = tau
        self.beta = beta

    def _score(self, image, id_text, negatives):
        id_logits = _logits(image.features, id_text, self.tau)
        if negatives is None or len(negatives) == 0:
            return _max_softmax(id_logits)
        neg_logits = _logits(image.features, negatives, self.tau)
        lse = np.logaddexp(logsumexp(id_logits, axis=1), logsumexp(neg_logits, axis=1))
        return np.exp(id_logits.max(axis=1) - lse) - self.beta * np.exp(neg_logits.max(axis=1) - lse)


def scorer_names(*tags: str) -> list[str]:
    """Zero-shot scorer names carrying every tag in ``tags``: the 7 logit-space ones ("logit"),
    then the 2 vocabulary-based ones ("needs-vocabulary")."""
    return REGISTRY.names(*tags)


def create_scorer(name: str, **hyperparameters) -> ZeroShotScorer:
    """A new scorer ``name`` with the paper's defaults overridden by ``hyperparameters``."""
    return REGISTRY.create(name, **hyperparameters)


def score_zeroshot(
    name: str,
    image: FeatureSet | np.ndarray,
    id_text: np.ndarray,
    negatives: np.ndarray | None = None,
    **hyperparameters,
) -> np.ndarray:
    """Scores (float64 (N,), higher = ID) of scorer ``name`` for image embeddings and label embeddings."""
    return create_scorer(name, **hyperparameters).score(image, id_text, negatives)
