"""From a detector spec and the FeatureSets of a run to a ready scorer: the one seam of every command.

:func:`build_scorer` is how ``oodeval score`` and ``oodeval.evaluate``
(:func:`oodeval.evaluation.evaluate_detectors`), the experiment grid and its validation search
(:mod:`oodeval.experiment`) and ``oodeval cnc evaluate`` turn a detector spec (a registry name, the
explicit hyperparameters, the cell's seed) and the FeatureSets of a run (:class:`RunSets`) into a
:class:`Scorer` (``fit(train)`` / ``score(fs)``). For a post-hoc detector it resolves, in this order:

* the fitting rows: ID train, or the rows the class declares it fits on (``fits_on``, NAC's
  tapped class-balanced subset, :class:`~oodeval.detectors.base.TappedRows`), asked of
  ``RunSets.tapped_rows`` with the size and seed of the detector's hyperparameters;
* the backbone defaults of the set it fits on (ID test when there is no ID train), under the
  explicit hyperparameters (:func:`oodeval.detectors.defaults.resolve_defaults`, which asks the
  class: :meth:`~oodeval.detectors.base.Detector.backbone_defaults`);
* the seed: given a ``seed``, a detector that takes one (``seed`` / ``random_state``) and was not
  given one explicitly receives it;
* the view: the class's declaration (``reads_outlier_class``); every other detector sees a K+1
  (CnC) model's K-way classifier (:meth:`~oodeval.detectors.base.Detector.view`, applied by the
  detector's own ``fit`` / ``score``).

A zero-shot model's scorer (``kind="zero-shot"``, :mod:`oodeval.zeroshot.scorers`) scores image
embeddings against the run's text ``context`` (``id_text``, and ``vocab(name)`` for the negative
labels of a vocabulary scorer). No detector is named here: what is special about one is declared by
its class (docs/extending.md).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from . import detectors
from .detectors import profiles
from .detectors.defaults import backbone_family, resolve_defaults
from .errors import InputError
from .features import FeatureSet
from .zeroshot.scorers import REGISTRY as ZS_REGISTRY
from .zeroshot.scorers import create_scorer

__all__ = ["RunSets", "Scorer", "build_scorer", "SEED_PARAMS", "KINDS"]

#: hyperparameter names through which a seeded detector receives the cell's seed
SEED_PARAMS = ("seed", "random_state")
#: the model kinds a scorer is built for
KINDS = ("supervised", "zero-shot")


@dataclass
class RunSets:
    """The FeatureSets of one run that a scorer is built from: ID train (None when there is none),
    ID test, and ``tapped_rows(size, seed)``: the tapped ID-train rows a detector that declares
    ``fits_on`` fits on (None from it, or no callable: ID train itself serves)."""

    train: FeatureSet | None
    test: FeatureSet | None
    tapped_rows: Callable[[int | None, int], FeatureSet | None] | None = None

    @property
    def source(self) -> FeatureSet | None:
        """The set whose metadata names the backbone: ID train, else ID test."""
        return self.train if self.train is not None else self.test


@dataclass
class Scorer:
    """A detector (or zero-shot scorer) ready to fit on :attr:`train` and score any FeatureSet of its run.

    ``hyperparameters``: the explicit ones it was built with (the seed added where it takes one;
    ``defaults``: the profile, where not paper); ``backbone``: the family of the run's backbone;
    ``profile``: the defaults profile it was built under; :meth:`resolved`: every hyperparameter it runs with.
    """

    name: str
    kind: str
    hyperparameters: dict
    train: FeatureSet | None
    backbone: str
    detector: object = None
    context: dict = field(default_factory=dict)
    vocabulary: str | None = None
    profile: str = profiles.PAPER

    @property
    def fit_needs(self) -> tuple[str, ...]:
        """What ``fit`` reads from its fitting rows (empty: nothing is learnt)."""
        return tuple(self.detector.fit_needs) if self.kind == "supervised" else ()

    def fit(self, train: FeatureSet | None) -> Scorer:
        if self.kind == "supervised":
            self.detector.fit(train)
        return self

    def score(self, fs: FeatureSet) -> np.ndarray:
        if self.kind == "supervised":
            return self.detector.score(fs)

        scorer = create_scorer(self.name, **self.hyperparameters)
        fs.check_finite(list(scorer.needs), self.name)
        negatives = self.context["vocab"](self.vocabulary) if scorer.uses_negatives else None
        if scorer.uses_negatives and negatives is None:
            raise InputError(f"zero-shot scorer {self.name!r} needs a vocabulary (set `vocabulary` in its table)")
        return scorer.score(fs, self.context["id_text"], negatives, normalize=True)

    @property
    def test_time(self) -> bool:
        """Whether it adapts to the stream it scores (a test-time zero-shot scorer: AdaNeg)."""
        return self.kind == "zero-shot" and bool(getattr(ZS_REGISTRY[self.name], "test_time", False))

    def score_pair(self, test: FeatureSet, fs: FeatureSet, order: int) -> tuple[np.ndarray, np.ndarray, dict]:
        """A test-time scorer's scores of the ID-test and OOD set ``fs`` streamed together in stream
        order ``order`` with fresh state (``oodeval.zeroshot.testtime``): two arrays of the sets' full
        lengths, NaN for rows the ID:OOD mix (hyperparameter ``id_share``) left out, and the settings."""
        from .zeroshot.testtime import Protocol, score_labelled

        scorer = create_scorer(self.name, **self.hyperparameters)
        protocol = Protocol(int(order), scorer.id_share)
        negatives = self.context["vocab"](self.vocabulary) if scorer.uses_negatives else None
        if scorer.uses_negatives and negatives is None:
            raise InputError(f"zero-shot scorer {self.name!r} needs a vocabulary (set `vocabulary` in its table)")
        is_id = np.r_[np.ones(len(test), bool), np.zeros(len(fs), bool)]
        pool = np.concatenate([np.asarray(test.features), np.asarray(fs.features)])
        s = score_labelled(scorer, pool, is_id, self.context["id_text"], negatives, protocol, normalize=True)
        return s[: len(test)], s[len(test) :], {**protocol.record(), "batch_size": scorer.batch_size}

    def resolved(self) -> dict:
        """Every hyperparameter it runs with: the detector's backbone defaults, under its profile's
        values, under the explicit ones, overlaid by what ``fit`` decided
        (:meth:`Detector.resolved_params`), and ``defaults``: the profile where not paper; a
        zero-shot scorer's explicit ones."""
        if self.kind != "supervised":
            return dict(self.hyperparameters)
        extra = {profiles.KEY: self.profile} if self.profile != profiles.PAPER else {}
        return {**self.detector.resolved_params(), **extra}


def _take(cls: type, hyperparameters: Mapping | None, **values: object) -> dict:
    """``hyperparameters`` plus each of ``values`` (not None) that ``cls``'s constructor takes and
    was not given explicitly: the cell's seed, the experiment's detector device."""
    hp = dict(hyperparameters or {})
    params = inspect.signature(cls).parameters
    for param, value in values.items():
        if value is not None and param in params and param not in hp:
            hp[param] = value
    return hp


def build_scorer(
    name: str,
    hyperparameters: Mapping | None,
    sets: RunSets,
    *,
    seed: int | None = None,
    kind: str = "supervised",
    context: dict | None = None,
    vocabulary: str | None = None,
    device: str | None = None,
) -> Scorer:
    """The :class:`Scorer` of detector ``name`` with explicit ``hyperparameters`` on the run's
    ``sets``, its fitting rows, backbone defaults, seed and view resolved (see the module
    docstring); fit it with ``scorer.fit(scorer.train)``. ``device`` (the experiment's
    ``detector_device``) goes to a detector that takes a ``device`` and was given none. A
    hyperparameter the detector does not take is an InputError naming it."""
    if kind not in KINDS:
        raise InputError(f"model kind must be one of {', '.join(KINDS)}, got {kind!r}")
    source = sets.source
    family = backbone_family(source.meta.get("model") if source is not None else None)
    if kind != "supervised":
        return Scorer(name, kind, dict(hyperparameters or {}), None, family, context=dict(context or {}), vocabulary=vocabulary)
    cls = detectors.REGISTRY[detectors.registry_name(name)]
    profile, explicit = profiles.split_profile(hyperparameters)
    hp = _take(cls, explicit, device=device, **dict.fromkeys(SEED_PARAMS, seed))
    det = _create(name, cls, source, hp, profile)
    train = sets.train
    if cls.fits_on is not None and sets.tapped_rows is not None:
        params = det.get_params()
        rows = sets.tapped_rows(params[cls.fits_on.size], params[cls.fits_on.seed])
        if rows is not None:  # its backbone defaults follow the tapped layers
            train = rows
            det = _create(name, cls, rows, hp, profile)
    recorded = {**hp, profiles.KEY: profile} if profile != profiles.PAPER else hp
    return Scorer(name, kind, recorded, train, family, det, profile=profile)


def _create(name: str, cls: type, source: FeatureSet | None, hp: dict, profile: str):
    try:
        return detectors.create(name, **resolve_defaults(cls, source, hp, profile))
    except TypeError as exc:
        raise InputError(f"detector {name!r} rejects hyperparameters {hp}: {exc}") from exc
