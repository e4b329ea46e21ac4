"""The detector contract shared by every post-hoc and zero-shot scorer.

scikit-learn's estimator contract: hyperparameters are constructor arguments stored unchanged
(``get_params`` / ``set_params`` / ``sklearn.base.clone`` work), state learned in ``fit`` lives
in attributes ending in ``_``, and ``fit`` recomputes all of it, so changing a hyperparameter
and refitting is always safe. ``score`` returns float64 (N,), higher = more in-distribution.

Input checks live here, once for every detector: ``fit`` and ``score`` reject NaN/inf in the arrays
they read (naming the set, the array and the count), and ``score`` rejects a set that does not
match the ID-train set ``fit`` saw (feature dimension, class count, head, extras, model; see
:meth:`FeatureSet.signature`). Hyperparameters are checked against the class's declared
``constraints`` (:mod:`oodeval.params`) when it is built, by ``set_params`` and again by ``fit``.

What is special about a detector is declared beside its class, and every command reads it from
there (:mod:`oodeval.scorer_factory`, docs/extending.md): ``backbone_defaults(backbone)`` (the releases'
per-backbone settings, each with its source, as timm keeps ``default_cfgs`` beside each model),
``reads_outlier_class`` (the view: a K+1 model's outlier class is hidden from every other
detector, :func:`oodeval.features.views.id_view`) and ``fits_on`` (rows of its own to fit on,
e.g. NAC's tapped subset, :class:`TappedRows`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from sklearn.base import BaseEstimator

from ..errors import InputError, StateError
from ..features import FeatureSet
from ..features.views import id_view
from ..params import Checked
from ._backend import Compute

__all__ = ["Detector", "OptInDetector", "Default", "BackboneInfo", "TappedRows", "check_fitted", "as_scores"]


@dataclass(frozen=True)
class Default:
    """A resolved hyperparameter value and where it comes from (a release's file, or why none applies)."""

    value: object
    source: str


@dataclass(frozen=True)
class BackboneInfo:
    """What a FeatureSet records about the model that made it, as :meth:`Detector.backbone_defaults`
    reads it (built by :func:`oodeval.detectors.defaults.backbone_of`): the backbone ``family``
    (one of :data:`oodeval.detectors.defaults.FAMILIES`), whether the releases treat it as a ViT
    (``vit_like``), the model name, the NAC layers tapped at extraction (``taps``), whether the
    features have logits, and the rest of the metadata."""

    family: str
    vit_like: bool = False
    model: str | None = None
    taps: tuple[str, ...] = ()
    has_logits: bool = True
    meta: Mapping = field(default_factory=dict)


@dataclass(frozen=True)
class TappedRows:
    """A ``fits_on`` declaration: the detector fits on a class-balanced subset of the ID-train rows
    extracted with NAC taps (:func:`oodeval.features.extract.extract_nac_fit`), of the size and seed
    given by its hyperparameters ``size`` and ``seed``, when the ID-train set holds no taps itself."""

    size: str = "n_fit"
    seed: str = "seed"


class Detector(Checked, BaseEstimator):
    """Base class. Subclasses set ``needs`` (see :data:`oodeval.features.FIELDS`), ``fit_needs``
    (what ``fit`` reads from the ID-train set; empty when nothing is learnt), ``constraints`` (one
    per hyperparameter, :mod:`oodeval.params`), and implement ``_fit`` (optional) and ``_score``."""

    param_kind = "detector"

    needs: ClassVar[tuple[str, ...]] = ()
    fit_needs: ClassVar[tuple[str, ...]] = ()
    #: whether the detector reads a K+1 (CnC) model's outlier class; every other one sees the
    #: K-way classifier of such a FeatureSet (:func:`oodeval.features.views.id_view`), in ``fit``
    #: and ``score`` alike
    reads_outlier_class: ClassVar[bool] = False
    #: the paper's name in report tables and figures (``rMaha++``; ``oodeval.report.labels``),
    #: declared on the class itself (a subclass does not inherit it); empty: the registry name
    label: ClassVar[str] = ""
    #: rows of its own to fit on (None: the ID-train set as it is); :class:`TappedRows` for NAC
    fits_on: ClassVar[TappedRows | None] = None
    #: hyperparameters whose value is {key: {param: value}} (NAC's ``layer_params``): an explicit
    #: value is merged into the backbone default key by key instead of replacing it
    merged_params: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def suits(cls, x: FeatureSet) -> bool:
        """Whether the default selection (:func:`oodeval.detectors.supported`) picks it for ``x``."""
        return True

    @classmethod
    def backbone_defaults(cls, backbone: BackboneInfo) -> dict[str, Default]:
        """The hyperparameters whose release value depends on ``backbone``, with their sources
        (default: none; the class defaults hold for every backbone). Called only for a known family."""
        return {}

    @classmethod
    def backbone_notes(cls, backbone: BackboneInfo) -> list[str]:
        """Lines ``oodeval score`` and ``run --check`` print about how the detector reads ``backbone`` (default: none)."""
        return []

    @classmethod
    def view(cls, x: FeatureSet) -> FeatureSet:
        """The FeatureSet the detector reads: ``x`` itself, or the K-way view of a K+1 model's
        features unless it declares ``reads_outlier_class``."""
        return x if cls.reads_outlier_class else id_view(x)

    def fit(self, train: FeatureSet | None = None) -> Detector:
        """Learn all derived state from the ID-train FeatureSet (harmless where nothing is learnt)."""
        self.check_params()
        for attr in [a for a in vars(self) if a.endswith("_") and not a.startswith("_")]:
            delattr(self, attr)
        who = type(self).__name__ + ".fit"
        if self.fit_needs:
            if train is None:
                raise InputError(f"{type(self).__name__} needs an ID-train FeatureSet to fit")
            train.require(self.fit_needs, who)
            train.check_finite(self.fit_needs, who)
            self._fit(self.view(train))
        if train is not None:
            self.train_signature_, self.train_name_ = train.signature(), train.name
        self.fitted_ = True
        return self

    def _fit(self, train: FeatureSet) -> None:  # pragma: no cover - default: nothing to learn
        return None

    def _compute(self) -> Compute:
        """Where and in what dtype the products run: the ``compute_dtype`` / ``device``
        hyperparameters (float64 on numpy for a detector without them; docs/conventions.md)."""
        return Compute(self.resolved_params().get("compute_dtype", "float64"), getattr(self, "device", None))

    def resolved_params(self) -> dict:
        """The hyperparameters the detector ran with: ``get_params()`` overlaid by what ``fit``
        decided itself (``resolved_``, e.g. a float32 path switched to float64), as result rows
        record them."""
        return {**self.get_params(), **getattr(self, "resolved_", {})}

    def score(self, x: FeatureSet) -> np.ndarray:
        """Scores of the samples in ``x``: float64 (N,), higher = more in-distribution."""
        check_fitted(self)
        who = type(self).__name__ + ".score"
        x.require(self.needs, who)
        if hasattr(self, "train_signature_"):
            x.check_agrees(self.train_signature_, self.train_name_, who)
        x.check_finite(self.needs, who)
        return as_scores(self._score(self.view(x)), len(x), type(self).__name__)

    def _score(self, x: FeatureSet) -> np.ndarray:
        raise NotImplementedError


class OptInDetector(Detector):
    """A detector run when named and left out of the default selection
    (:func:`oodeval.detectors.supported`): the peers' and the since-paper methods (docs/detectors.md),
    so that ``oodeval score`` / ``oodeval run`` without a detector list keep running the paper's 21
    (and cnc)."""

    @classmethod
    def suits(cls, x: FeatureSet) -> bool:
        return False


def check_fitted(det: Detector) -> None:
    """Raise a clear error when ``score`` is called before ``fit``."""
    if not getattr(det, "fitted_", False):
        raise StateError(f"{type(det).__name__} is not fitted; call fit(train) first")


def as_scores(scores: object, n: int, who: str) -> np.ndarray:
    """Cast to float64 (n,) and reject non-finite output with a message naming the detector."""
    out = np.asarray(scores, dtype=np.float64).reshape(-1)
    if out.shape != (n,):
        raise InputError(f"{who} produced {out.shape[0]} scores for {n} samples")
    bad = ~np.isfinite(out)
    if bad.any():
        raise InputError(f"{who} produced {int(bad.sum())} non-finite scores of {n}")
    return out
