"""The common contract of a detector, checked on a small synthetic problem (for plugin authors).

:func:`check_detector` is oodeval's analogue of scikit-learn's ``check_estimator``: it runs the
rules every detector follows (:mod:`oodeval.detectors.base`, docs/extending.md) on a class and
raises ``AssertionError`` naming the first one broken. It does not judge how well the detector
separates OOD data (no "higher = ID" sanity check): that depends on the method and the data.
"""

from __future__ import annotations

import inspect
from dataclasses import replace

import numpy as np
from sklearn.base import clone

from .detectors._synthetic import synthetic_problem
from .detectors.base import Detector
from .errors import InputError, StateError
from .features import FeatureSet
from .params import outside

__all__ = ["check_detector", "small_problem", "network_problem"]


def small_problem(seed: int = 0) -> tuple[FeatureSet, FeatureSet, FeatureSet]:
    """(ID train, ID test, OOD) of :func:`~oodeval.detectors._synthetic.synthetic_problem`: 5 classes,
    16-d features, 200 / 40 / 40 rows, with a head, logits and NAC states; fits in milliseconds."""
    return synthetic_problem(n_classes=5, dim=16, n_train=200, n_test=40, n_ood=40, seed=seed)


def network_problem(seed: int = 0) -> tuple[FeatureSet, FeatureSet, FeatureSet]:
    """:func:`small_problem` with synthetic arrays of every network pass (``features.passes``) and
    their settings in ``meta["passes"]``, for the detectors tagged ``network``: ODIN logits and the
    RankFeat blocks' logits near the logits, mds layers and Gram rows from slices of the features
    (Gram rows non-negative), MC-dropout means and variances from noisy softmaxes, i-ODIN's logits and
    AdaSCALE's perturbed features near the logits and features, two deep-ensemble members' logits. ID train's mds
    pass is clean (noise 0) as an ID-train fit set's is; so are the others' (no perturbation to check)."""
    rng = np.random.default_rng(seed + 1)
    settings = {"odin": {"temperature": 1000.0, "noise": 0.0014}, "mds": {"noise": 0.0, "layers": ["a", "b"]},
                "gram": {"powers": 3, "layers": ["a", "b"]}, "rankfeat": {"blocks": ["b3", "b4"]},
                "mcd": {"samples": 4, "p": 0.5, "where": "head", "seed": 0}, "adascale": {"o": 0.05, "step": 0.5},
                "iodin": {"temperature": 1000.0, "noise": 0.0014}}  # fmt: skip

    def add(fs: FeatureSet) -> FeatureSet:
        f, z = np.asarray(fs.logits, np.float64), np.asarray(fs.features, np.float64)

        def near(a: np.ndarray) -> np.ndarray:
            return (a + 0.1 * rng.standard_normal(a.shape)).astype(np.float32)

        draws = np.stack([near(f) for _ in range(4)])
        p = np.exp(draws - draws.max(axis=2, keepdims=True))
        p /= p.sum(axis=2, keepdims=True)
        extras = {"odin/logits": near(f), "rankfeat/b3": near(f), "rankfeat/b4": near(f),
                  "mds/a": near(z[:, :6]), "mds/b": near(z[:, 6:]),
                  "gram/a": np.abs(near(np.stack([z[:, :6] ** 2] * 3, axis=1))), "gram/b": np.abs(near(np.stack([z[:, 6:]] * 3, axis=1))),
                  "mcd/probs": p.mean(axis=0).astype(np.float32), "mcd/logits": draws.mean(axis=0).astype(np.float32),
                  "mcd/var": p.var(axis=0, ddof=1).mean(axis=1).astype(np.float32)}  # fmt: skip
        extras.update({"ensemble/0": near(f), "ensemble/1": near(f), "iodin/logits": near(f), "adascale/features": near(z)})
        members = [{"name": f"m{k}", "model": "synthetic", "weights_hash": str(k), "content_hash": str(k)} for k in range(2)]
        passes = {k: {"kind": k, **v} for k, v in settings.items()}
        return replace(fs, extras={**fs.extras, **extras}, meta={**fs.meta, "passes": passes, "ensemble": {"members": members}})

    return tuple(add(fs) for fs in small_problem(seed))


def _with_outlier_class(fs: FeatureSet) -> FeatureSet:
    """``fs`` as a K+1 (CnC) model's features: one more logit column, the outlier class, and no head."""
    k = fs.logits.shape[1]
    extra = -np.abs(fs.logits).mean(axis=1, keepdims=True).astype(np.float32)
    return replace(fs, logits=np.hstack([fs.logits, extra]), weight=None, bias=None,
                   meta={**fs.meta, "num_id_classes": k, "outlier_class": k})  # fmt: skip


def _poisoned(fs: FeatureSet) -> FeatureSet:
    """A copy of ``fs`` with one NaN in every per-sample float array (features, logits, extras)."""

    def nan(a: np.ndarray) -> np.ndarray:
        a = np.array(a, copy=True)
        a.reshape(a.shape[0], -1)[0, 0] = np.nan
        return a

    extras = {k: nan(v) if np.issubdtype(v.dtype, np.floating) else v for k, v in fs.extras.items()}
    return replace(fs, features=nan(fs.features), logits=None if fs.logits is None else nan(fs.logits), extras=extras)


def _raises(kind: type[BaseException], call, what: str, must_name: str | None = None) -> None:
    try:
        call()
    except kind as exc:
        assert must_name is None or must_name in str(exc), f"{what}: the {kind.__name__} does not name {must_name!r}: {exc}"
        return
    except Exception as exc:  # noqa: BLE001 - reported as the broken rule
        raise AssertionError(f"{what}: raised {type(exc).__name__} ({exc}), expected {kind.__name__}") from exc
    raise AssertionError(f"{what}: no {kind.__name__} raised")


def _check_constraints(cls: type[Detector], hp: dict, params: dict) -> None:
    """Every hyperparameter declared; each value outside its constraint refused, naming it."""
    name = cls.__name__
    declared = getattr(cls, "constraints", {})
    missing = sorted(set(params) - set(declared))
    assert not missing, f"{name} declares no constraint for {', '.join(missing)} (class attribute `constraints`, docs/extending.md)"
    for key, constraint in declared.items():
        if key not in params:
            continue
        for bad in outside(constraint):
            what = f"{name}({key}={bad!r})"
            _raises(InputError, lambda: cls(**{**hp, key: bad}), what, must_name=f"{key}=")
            det = cls(**hp)
            _raises(InputError, lambda: det.set_params(**{key: bad}), f"{name}.set_params({key}={bad!r})", must_name=f"{key}=")
            assert det.get_params() == params, f"{name}.set_params({key}={bad!r}) was refused but changed the parameters"


def check_detector(cls: type[Detector], hyperparameters: dict | None = None,
                   problem: tuple[FeatureSet, FeatureSet, FeatureSet] | None = None) -> None:  # fmt: skip
    """Check that ``cls`` follows the detector contract; ``AssertionError`` naming the broken rule.

    ``hyperparameters`` are passed to the constructor (e.g. a small ``k`` for kNN on the small
    problem); ``problem`` is (train, test, ood), default :func:`small_problem` (turned into a K+1
    model's features when ``cls.suits`` refuses the plain one). The rules: the constructor stores
    its arguments unchanged and ``get_params`` returns exactly the constructor's parameters;
    ``set_params`` and ``sklearn.base.clone`` round-trip them; every hyperparameter has a declared
    constraint (``cls.constraints``, :mod:`oodeval.params`), the defaults meet it, and a value
    outside it (from each constraint's ``outside()``) is an :class:`~oodeval.errors.InputError`
    naming the hyperparameter, in the constructor and in ``set_params`` (which then leaves the
    parameters as they were); ``score`` before ``fit`` is a
    :class:`~oodeval.errors.StateError`; ``fit`` returns the detector; ``score`` returns float64 (N,),
    finite; refitting (after a fit on other rows) and a clone give bit-identical scores; NaN in the
    input is an :class:`~oodeval.errors.InputError` in ``score`` (and in ``fit`` when it learns).
    """
    name = cls.__name__
    hp = dict(hyperparameters or {})
    train, test, ood = problem or small_problem()
    if problem is None and cls.reads_outlier_class:
        train, test, ood = (_with_outlier_class(fs) for fs in (train, test, ood))
    assert issubclass(cls, Detector), f"{name} is not a subclass of oodeval.detectors.base.Detector"
    try:
        cls()
    except InputError as exc:
        raise AssertionError(f"{name}'s own defaults break its declared constraints: {exc}") from exc

    det = cls(**hp)
    params = det.get_params()
    signature = [p for p in inspect.signature(cls).parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert set(params) == {p.name for p in signature}, (
        f"{name}.get_params() keys {sorted(params)} differ from the constructor's {sorted(p.name for p in signature)}")
    for key, value in hp.items():
        assert params[key] is value, f"{name}.__init__ did not store {key} unchanged (got {params[key]!r}, passed {value!r})"
    for p in signature:
        if p.name not in hp and p.default is not p.empty:
            assert params[p.name] is p.default or params[p.name] == p.default, (
                f"{name}.__init__ changed the default of {p.name} ({p.default!r} -> {params[p.name]!r})")
    assert det.set_params(**params) is det, f"{name}.set_params does not return the detector"
    assert det.get_params() == params, f"{name}.set_params(**get_params()) changed the parameters"
    twin = clone(det)
    assert twin is not det and twin.get_params() == params, f"sklearn.base.clone({name}) changed the parameters"
    _check_constraints(cls, hp, params)

    _raises(StateError, lambda: cls(**hp).score(test), f"{name}.score before fit")
    assert det.fit(train) is det, f"{name}.fit does not return the detector"
    first = det.score(test)
    assert isinstance(first, np.ndarray) and first.dtype == np.float64 and first.shape == (len(test),), (
        f"{name}.score returned {type(first).__name__} {getattr(first, 'dtype', '')} {getattr(first, 'shape', '')}, "
        f"expected float64 ({len(test)},)")
    assert np.isfinite(first).all(), f"{name}.score returned non-finite scores"
    assert det.get_params() == params, f"{name}.fit changed its hyperparameters"
    assert np.isfinite(det.score(ood)).all(), f"{name}.score returned non-finite scores on the OOD set"

    det.fit(train.subset(slice(0, len(train) // 2 + 1)))
    det.fit(train)
    assert np.array_equal(det.score(test), first), f"{name}: refitting on the same rows changed the scores"
    assert np.array_equal(twin.fit(train).score(test), first), f"{name}: a clone fitted on the same rows scores differently"

    _raises(InputError, lambda: det.score(_poisoned(test)), f"{name}.score on a set with NaN")
    if cls.fit_needs:
        _raises(InputError, lambda: cls(**hp).fit(_poisoned(train)), f"{name}.fit on a set with NaN")
