"""One way to make something creatable by name: the post-hoc detectors and the zero-shot scorers.

A :class:`Registry` maps names to classes, each registered with ``@REGISTRY.register(name,
tags=(...), order=N)``. ``names(*tags)`` lists the names carrying every given tag, sorted by
``order`` (the paper's order; unordered entries follow in registration order), so no list of
names is written twice. Packages extend a registry by naming a module in its entry-point group
(``oodeval.detectors`` / ``oodeval.zeroshot_scorers``); the module is imported on first use and
registers its classes, so they work in every command (docs/extending.md). ``create(name, **hyperparameters)`` builds one and names the valid
hyperparameters when given an unknown one, or the limit a value breaks (:mod:`oodeval.params`). Tags in use: "paper21" (the Fi-ImageNet-1k paper's 21
post-hoc detectors), the paper's groups "logit", "activation", "feature", "hybrid", "cnc" (reads
the outlier class of a K+1 model), "zeroshot" and "needs-vocabulary" (a negative vocabulary).
Other tools' names can be registered as aliases (``alias(name, target, source)``): every lookup
accepts them, :meth:`Registry.canonical` maps them to the registered name and logs that it did.
"""

from __future__ import annotations

import inspect
import logging
import math
import numbers
from collections.abc import Callable, Iterator, Mapping
from importlib.metadata import entry_points

from .errors import InputError, UnknownNameError
from .params import check_hyperparameters, refuse

__all__ = ["Registry"]

log = logging.getLogger(__name__)


class Registry(Mapping[str, type]):
    """name -> class, with tags and an order. On first use ``load`` (optional) imports the
    registering modules, then the modules of entry-point ``group`` are imported (plugins), so
    that importing the package stays light."""

    def __init__(self, kind: str, group: str, load: Callable[[], None] | None = None) -> None:
        self.kind = kind
        self.group = group
        self._load = load
        self._loaded = False
        self._classes: dict[str, type] = {}
        self._tags: dict[str, frozenset[str]] = {}
        self._order: dict[str, float] = {}
        self._aliases: dict[str, tuple[str, str]] = {}  # alias -> (registered name, whose name it is)
        self._extra_tags: dict[str, set[str]] = {}
        self._said: set[str] = set()

    def register(self, name: str, *, tags: tuple[str, ...] = (), order: int | None = None) -> Callable[[type], type]:
        """Class decorator: make ``name`` creatable; sets ``cls.name`` and ``cls.tags``."""

        def deco(cls: type) -> type:
            if name in self._classes and self._classes[name] is not cls:
                raise InputError(f"{self.kind} {name!r} registered twice")
            self._classes[name] = cls
            self._tags[name] = frozenset(tags)
            self._order[name] = math.inf if order is None else order
            cls.name, cls.tags = name, frozenset(tags)
            return cls

        return deco

    def alias(self, name: str, target: str, source: str, *, tags: tuple[str, ...] = ()) -> None:
        """Accept ``name`` (``source``'s name for it, e.g. "OpenOOD v1.5") for the registered
        ``target``, and give ``target`` the extra ``tags``; ``name == target`` only adds the tags."""
        if name != target:
            if name in self._classes or self._aliases.get(name, (target,))[0] != target:
                raise InputError(f"{self.kind} alias {name!r} is taken")
            self._aliases[name] = (target, source)
        self._extra_tags.setdefault(target, set()).update(tags)

    def aliases(self) -> dict[str, tuple[str, str]]:
        """alias -> (registered name, whose name it is)."""
        self._ensure_loaded()
        return dict(self._aliases)

    def canonical(self, name: str) -> str:
        """The registered name for ``name`` (itself, or the target of an alias, which is logged
        once per process); an unknown name raises KeyError naming the known ones."""
        self._ensure_loaded()
        if name in self._classes:
            return name
        if name in self._aliases and self._aliases[name][0] in self._classes:
            target, source = self._aliases[name]
            if name not in self._said:
                self._said.add(name)
                log.info("%s %r is %s's name for oodeval's %r", self.kind, name, source, target)
            return target
        raise UnknownNameError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")

    def tags_of(self, name: str) -> frozenset[str]:
        """Every tag of the registered ``name`` (its own and those aliases gave it)."""
        name = self.canonical(name)
        return self._tags[name] | self._extra_tags.get(name, set())

    def _ensure_loaded(self) -> None:
        if not self._loaded:
            self._loaded = True
            if self._load is not None:
                self._load()
            for plugin in entry_points(group=self.group):
                plugin.load()

    def __getitem__(self, name: str) -> type:
        return self._classes[self.canonical(name)]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        self._ensure_loaded()
        return len(self._classes)

    def __contains__(self, name: object) -> bool:
        self._ensure_loaded()
        return name in self._classes or (name in self._aliases and self._aliases[name][0] in self._classes)

    def all_tags(self) -> list[str]:
        """Every tag in use, sorted."""
        self._ensure_loaded()
        return sorted(set().union(*self._tags.values(), *(self._extra_tags.get(n, set()) for n in self._classes)))

    def names(self, *tags: str) -> list[str]:
        """Names carrying every tag in ``tags`` (all names when none), in registry order."""
        self._ensure_loaded()
        unknown = sorted(set(tags) - set(self.all_tags()))
        if unknown:
            raise InputError(f"unknown {self.kind} tag(s) {', '.join(unknown)}; tags: {', '.join(self.all_tags())}")
        index = {n: i for i, n in enumerate(self._classes)}
        chosen = [n for n in self._classes if (self._tags[n] | self._extra_tags.get(n, set())).issuperset(tags)]
        return sorted(chosen, key=lambda n: (self._order[n], index[n]))

    def create(self, name: str, **hyperparameters: object) -> object:
        """A new ``name`` with its defaults overridden by ``hyperparameters``: unknown names (with the
        closest known ones, or the new name of a renamed one) and values the class's declared
        ``constraints`` refuse (:mod:`oodeval.params`) are one InputError naming all of them."""
        cls = self[name]
        refuse(check_hyperparameters(cls, hyperparameters))
        declared = getattr(cls, "constraints", {})
        for key, value in hyperparameters.items():
            if key not in declared:
                params = inspect.signature(cls).parameters
                default = params[key].default if key in params else inspect.Parameter.empty
                _check_type(f"{self.kind} {name!r}", key, value, default)
        return cls(**hyperparameters)


def _check_type(who: str, key: str, value: object, default: object) -> None:
    """Refuse a value of the wrong kind for a hyperparameter whose default is a number (None is
    let through: "all" / "auto" for some) or a boolean (``temperature="abc"``); other defaults
    (None, strings) take any value; for a hyperparameter the class declares no constraint for."""
    is_bool = type(value).__name__ in ("bool", "bool_")  # Python's or numpy's, without importing numpy
    if isinstance(default, bool):
        if not is_bool:
            raise InputError(f"{who}: {key}={value!r} must be true or false (default {default})")
    elif isinstance(default, numbers.Real):
        if value is not None and (is_bool or not isinstance(value, numbers.Real)):
            raise InputError(f"{who}: {key}={value!r} is not a number (default {default})")
