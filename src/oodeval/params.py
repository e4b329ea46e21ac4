"""Declared hyperparameter constraints, checked when a detector or a zero-shot scorer is built.

scikit-learn's ``_parameter_constraints`` in a small form: a class maps each hyperparameter to a
constraint, or to a tuple of alternatives (``None`` among them lets None through)::

    constraints = {"k": Interval(Integral, 1, None), "temperature": Interval(Real, 0, None, closed="neither"),
                   "dim": (Interval(Integral, 1, None), None), "compute_dtype": COMPUTE_DTYPE, "device": DEVICE}

:class:`Checked` (a base of :class:`oodeval.detectors.base.Detector` and
:class:`oodeval.zeroshot.scorers.ZeroShotScorer`) checks them after ``__init__`` (so also in
``sklearn.base.clone``), after ``set_params`` and at ``fit``, and raises one
:class:`~oodeval.errors.InputError` naming the class, each bad hyperparameter, its value and its
limit. Limits that depend on the data (k above the bank size) stay in ``fit``. A name the class
does not take is refused with a "did you mean" (difflib), and a renamed one (:data:`RENAMED`) with
its new name (docs/extending.md, "Declaring hyperparameter constraints").
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from numbers import Integral, Real

from .errors import InputError

__all__ = [
    "Interval", "Options", "Device", "Instance", "BOOLEAN", "COMPUTE_DTYPE", "DEVICE", "COMPUTE", "POSITIVE", "SEED",
    "RENAMED", "Checked", "param_names",
    "Integral", "Real", "accepts", "describe", "outside", "violations", "unknown_names", "check_hyperparameters", "refuse",
]  # fmt: skip

#: hyperparameters renamed since an earlier release: old name -> new name (the old one is refused)
RENAMED = {"precision": "compute_dtype"}


def _is_bool(value: object) -> bool:
    return type(value).__name__ in ("bool", "bool_")  # Python's or numpy's, without importing numpy


@dataclass(frozen=True)
class Interval:
    """A number of ``kind`` (``Integral``: whole numbers, ``Real``: any finite number; booleans are
    neither) between ``low`` and ``high`` (None: unbounded); ``closed`` says which ends belong to it:
    "both" (default), "left", "right" or "neither"."""

    kind: type
    low: float | None
    high: float | None
    closed: str = "both"

    def accepts(self, value: object) -> bool:
        if _is_bool(value) or not isinstance(value, self.kind):
            return False
        if not math.isfinite(value):
            return False
        left, right = self.closed in ("both", "left"), self.closed in ("both", "right")
        if self.low is not None and not (value >= self.low if left else value > self.low):
            return False
        return self.high is None or (value <= self.high if right else value < self.high)

    def __str__(self) -> str:
        what = "an integer" if self.kind is Integral else "a number"
        left, right = self.closed in ("both", "left"), self.closed in ("both", "right")
        if self.low is not None and self.high is not None:
            return f"{what} in {'[' if left else '('}{self.low}, {self.high}{']' if right else ')'}"
        if self.low is not None:
            return f"{what} {'>=' if left else '>'} {self.low}"
        if self.high is not None:
            return f"{what} {'<=' if right else '<'} {self.high}"
        return what if self.kind is Integral else "a finite number"

    def outside(self) -> list[object]:
        """Values just outside the interval, and of the wrong kind (for contract tests)."""
        out: list[object] = ["abc", 2.5 if self.kind is Integral else float("nan")]
        step = 1 if self.kind is Integral else 0.5
        for bound, sign, inside in ((self.low, -1, self.closed in ("both", "left")), (self.high, 1, self.closed in ("both", "right"))):
            if bound is not None:
                out.append(bound + sign * step if inside else (int(bound) if self.kind is Integral else bound))
        return out


@dataclass(frozen=True)
class Options:
    """One of the given values (strings)."""

    values: tuple

    def __init__(self, *values: object) -> None:
        object.__setattr__(self, "values", tuple(values))

    def accepts(self, value: object) -> bool:
        return isinstance(value, str) and value in self.values

    def __str__(self) -> str:
        return "one of " + ", ".join(repr(v) for v in self.values)

    def outside(self) -> list[object]:
        return ["float16" if "float32" in self.values else "not-an-option"]


@dataclass(frozen=True)
class Device:
    """A torch device name: "cpu", "cuda" or "cuda:N" (None, the numpy backend, is an alternative
    the declaration adds). Whether CUDA is present is checked where the detector computes."""

    def accepts(self, value: object) -> bool:
        return isinstance(value, str) and re.fullmatch(r"cpu|cuda(:\d+)?", value) is not None

    def __str__(self) -> str:
        return "a torch device ('cpu', 'cuda', 'cuda:N')"

    def outside(self) -> list[object]:
        return ["cdua"]


@dataclass(frozen=True)
class Instance:
    """An instance of one of ``types`` (booleans only where ``bool`` is named)."""

    types: tuple

    def __init__(self, *types: type) -> None:
        object.__setattr__(self, "types", tuple(types))

    def accepts(self, value: object) -> bool:
        if _is_bool(value) and bool not in self.types:
            return False
        return isinstance(value, self.types)

    def __str__(self) -> str:
        names = {"bool": "true or false", "dict": "a table", "list": "a list", "tuple": "a list", "str": "a string"}
        return " or ".join(dict.fromkeys(names.get(t.__name__, t.__name__) for t in self.types))

    def outside(self) -> list[object]:
        return [object()]


BOOLEAN = Instance(bool)
#: the compute dtype of a detector's products (docs/conventions.md, "Precision")
COMPUTE_DTYPE = Options("float32", "float64")
#: None = numpy, else a torch device
DEVICE = (Device(), None)
#: what every detector with a float32 path takes (docs/conventions.md, "Precision")
COMPUTE: Mapping[str, object] = {"compute_dtype": COMPUTE_DTYPE, "device": DEVICE}
#: a temperature, a scale: a number > 0
POSITIVE = Interval(Real, 0, None, closed="neither")
#: a seed of ``numpy.random.default_rng``
SEED = Interval(Integral, 0, None)


def _alternatives(constraint: object) -> tuple:
    return constraint if isinstance(constraint, tuple) else (constraint,)


def accepts(constraint: object, value: object) -> bool:
    """Whether ``value`` meets the declared ``constraint`` (one of its alternatives)."""
    return any(value is None if c is None else c.accepts(value) for c in _alternatives(constraint))


def describe(constraint: object) -> str:
    """The limit, in words."""
    return " or ".join("None" if c is None else str(c) for c in _alternatives(constraint))


def outside(constraint: object) -> list[object]:
    """Values the declared ``constraint`` refuses, from each alternative's ``outside()`` (for the
    contract check, :func:`oodeval.testing.check_detector`)."""
    found = [v for c in _alternatives(constraint) if c is not None for v in getattr(c, "outside", list)()]
    return [v for v in found if not accepts(constraint, v)]


def _owner(cls: type) -> str:
    return f"{getattr(cls, 'param_kind', 'estimator')} {vars(cls).get('name') or cls.__name__!r}"


def violations(cls: type, values: Mapping[str, object]) -> list[str]:
    """One sentence per value in ``values`` that the declared constraint of ``cls`` refuses."""
    declared = getattr(cls, "constraints", {})
    return [f"{key}={value!r} must be {describe(declared[key])}"
            for key, value in values.items() if key in declared and not accepts(declared[key], value)]  # fmt: skip


@functools.cache
def _parameters(cls: type) -> tuple[inspect.Parameter, ...]:
    """The constructor's parameters, looked up once per class: ``inspect.signature`` of a class
    without its own ``__init__`` parses object's text signature and copies ``sys.modules`` each
    time (about 1 ms with torch loaded: a light detector's whole score)."""
    return tuple(inspect.signature(cls).parameters.values())


def param_names(cls: type) -> list[str]:
    """The constructor's hyperparameter names (as ``get_params`` lists them)."""
    return sorted(p.name for p in _parameters(cls) if p.name != "self" and p.kind is p.POSITIONAL_OR_KEYWORD)


def unknown_names(cls: type, names: Iterable[str]) -> list[str]:
    """Sentences about the names the constructor of ``cls`` does not take, each starting with the
    class: one for every renamed name (:data:`RENAMED`) with its new name, one listing the others
    with the closest known names (difflib) and every name it takes."""
    if any(p.kind is p.VAR_KEYWORD for p in _parameters(cls)):
        return []
    who, known = _owner(cls), param_names(cls)
    unknown = sorted(set(names) - set(known))
    out = [f"{who}: {n} was renamed to {RENAMED[n]}; write {RENAMED[n]} instead" for n in unknown if RENAMED.get(n) in known]
    rest = [n for n in unknown if RENAMED.get(n) not in known]
    if rest:
        shown = []
        for n in rest:
            close = difflib.get_close_matches(n, known, n=2)
            shown.append(f"{n} (did you mean {' or '.join(close)}?)" if close else n)
        out.append(f"{who} has no hyperparameter(s) {', '.join(shown)}; it takes: {', '.join(known) or 'none'}")
    return out


def check_hyperparameters(cls: type, values: Mapping[str, object], candidates: bool = False) -> list[str]:
    """Every problem with ``values`` for ``cls`` (unknown names, then refused values), each a sentence
    that starts with the class ("detector 'knn': k=-5 must be an integer >= 1"); [] when none. With
    ``candidates`` each value is a list of candidate values (a search grid), each one checked."""
    who = _owner(cls)
    pairs = [(k, v) for k, vs in values.items() for v in vs] if candidates else list(values.items())
    return unknown_names(cls, values) + [f"{who}: {p}" for k, v in pairs for p in violations(cls, {k: v})]


def refuse(problems: list[str]) -> None:
    """One InputError stating every problem, when there is one."""
    if problems:
        raise InputError("; ".join(problems))


class Checked:
    """Mixin for scikit-learn-style estimators: the declared ``constraints`` are checked after every
    ``__init__`` (the outermost one, once the object is complete), after ``set_params`` and by
    :meth:`check_params`. ``param_kind`` names the kind in messages ("detector")."""

    constraints: Mapping[str, object] = {}
    param_kind = "estimator"

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None or getattr(init, "_checks_params", False):
            return

        @functools.wraps(init)
        def checked(self, *args, **kw) -> None:
            init(self, *args, **kw)
            if type(self).__init__ is checked:  # a subclass's own __init__ checks when it is done
                self.check_params()

        checked._checks_params = True  # type: ignore[attr-defined]
        cls.__init__ = checked

    def check_params(self) -> None:
        """InputError naming every hyperparameter whose value its declared constraint refuses."""
        refuse(check_hyperparameters(type(self), {k: getattr(self, k) for k in param_names(type(self)) if hasattr(self, k)}))

    def set_params(self, **params):
        """scikit-learn's ``set_params``, refusing (and leaving unchanged) what the declarations refuse."""
        refuse(check_hyperparameters(type(self), params))
        return super().set_params(**params)
