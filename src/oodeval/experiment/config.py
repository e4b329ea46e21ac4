"""The experiment file: models x detectors x datasets x seeds, validated strictly.

TOML (``tomllib``) or YAML (``.yaml`` / ``.yml``). Unknown keys are errors, never ignored;
relative paths are relative to the experiment file's folder. See ``docs/experiments.md``::

    store = "store"                   # feature store (cached FeatureSets)
    results = "results.parquet"       # the one results table
    seeds = [0]                       # bootstrap seeds (runs); see seed_detectors
    bootstrap_draws = 1000
    bootstrap_fixed_id = true         # resample OOD only, ID threshold fixed (paper App. C); false: both

    [datasets]
    id_train = "imagefolder:train"    # fits the detectors (supervised models only)
    id_test = "imagefolder:val"
    ood = ["ninco", { name = "data/fi", label = "Fi", split_column = "fine_grained", group = "near" }]
    # or, instead of [datasets], an OpenOOD v1.5 benchmark on an OpenOOD data root as it lies:
    # [openood]  benchmark = "cifar10"  root = "/data/openood"   (near / far groups included)

    [[models]]
    name = "resnet50"
    weights = "ckpt/resnet50.safetensors"   # or one per seed: ["a.pt", "b.pt"]
    # or pretrained = true (the hub weights the name names) / false (random init, chosen);
    # a model that extracts needs one of the three

    [[detectors]]                     # omitted: every detector the features support
    name = "knn"
    hyperparameters = { k = 50 }

Every detector's and zero-shot scorer's hyperparameters (names and values, search candidates
included) are checked against its declared constraints (:mod:`oodeval.params`) while the file is
loaded, and all problems found are one InputError, before anything is extracted.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..data.openood import experiment_datasets
from ..detectors import REGISTRY, REGISTRY as DETECTORS, profiles, registry_name
from ..errors import InputError, UnknownNameError
from ..features.pass_options import KINDS as PASS_KINDS
from ..features.pass_options import PassSpec, parse_pass
from ..params import Device, check_hyperparameters
from ..results import hp_json
from ..zeroshot.scorers import REGISTRY as SCORERS

__all__ = ["ExperimentConfig", "ModelSpec", "DetectorSpec", "ExperimentDataset", "SweepSpec", "SelectionSpec", "load_config", "KINDS"]

KINDS = ("supervised", "zero-shot")
_ROLES = ("id_train", "id_test")

_TOP = {
    "name", "store", "results", "data_root", "seeds", "bootstrap_draws", "bootstrap_fixed_id", "device", "batch_size",
    "num_workers", "retry_failed", "seed_detectors", "datasets", "models", "detectors", "zeroshot", "sweeps", "selection",
    "eoe_prompts", "openood", "detector_device", "full_image_hash", "defaults",
}  # fmt: skip
_DATASETS = {"id_train", "id_test", "ood", "csid", "split_column", "id_classes"}
_OPENOOD = {"benchmark", "root", "full_spectrum"}
_OOD = {"name", "label", "split_column", "group"}
_MODEL = {
    "name", "label", "weights", "pretrained", "head", "kind", "model_kwargs", "taps", "patch_features", "full_patch_features", "features",
    "detectors", "ensemble", *PASS_KINDS,
}  # fmt: skip
_DETECTOR = {"name", "label", "hyperparameters", "vocabulary", "search", "generations", "defaults"}
_SELECTION = {"validation_id", "validation_ood"}
_SWEEP = {"name", "vocabulary", "sizes", "scorer", "hyperparameters", "kind", "seed"}
#: the placeholder of a generation index in a vocabulary path (``generations = N`` expands it to 0..N-1)
GENERATION = "{g}"


@dataclass(frozen=True)
class DetectorSpec:
    """One detector configuration: registry name, hyperparameter overrides, optional vocabulary
    (zero-shot vocabulary scorers), a display label (default: the name), and an optional
    ``search`` grid (hyperparameter -> candidate values) chosen on the validation sets of
    ``[selection]``, never on a test set."""

    name: str
    hyperparameters: dict = field(default_factory=dict)
    label: str = ""
    vocabulary: str | None = None
    search: dict = field(default_factory=dict)

    @property
    def display(self) -> str:
        return self.label or self.name

    @property
    def result_key(self) -> str:
        """The ``hyperparameters`` key of this configuration's rows in the results table: the
        overrides, plus the vocabulary of a vocabulary scorer, as canonical JSON."""
        extra = {"vocabulary": self.vocabulary} if self.vocabulary is not None else {}
        if self.search:
            extra["search"] = self.search
        return hp_json({**self.hyperparameters, **extra})


@dataclass(frozen=True)
class SelectionSpec:
    """Validation data of the opt-in hyperparameter search: an ID split and an OOD set, neither
    of them a test set (``id_test`` or one of ``ood``)."""

    validation_id: ExperimentDataset
    validation_ood: ExperimentDataset


@dataclass(frozen=True)
class SweepSpec:
    """A vocabulary-size sweep of the zero-shot models. ``kind = "prefix"`` (Fig. A2): ``scorer`` with
    the first M labels of a ranked ``vocabulary`` (e.g. NegMined WordNet, least ID-like first) for
    each M in ``sizes``. ``kind = "siblings"`` (Fig. A1, A3): the pool of k siblings per ID class of
    an ``oodeval vocab llm`` vocabulary (its per-class lists), drawn in ``seed``-ed random order, for
    each k in ``sizes`` (a k above a class's list keeps all of it)."""

    name: str
    vocabulary: str
    sizes: tuple[int, ...]
    scorer: str = "neglabel"
    hyperparameters: dict = field(default_factory=dict)
    kind: str = "prefix"
    seed: int = 0


@dataclass(frozen=True)
class ExperimentDataset:
    """A dataset: a registry name or a path, the label used in the results, an optional split column,
    and an optional group (e.g. ``near`` / ``far``) whose mean the report shows."""

    name: str
    label: str
    split_column: str | None = None
    group: str | None = None


@dataclass(frozen=True)
class ModelSpec:
    """A model: backbone name, weights (one, or one per seed), an optional linear-probe head file
    (``oodeval probe``) for a frozen backbone, kind, extraction options, precomputed FeatureSet
    folders by dataset role/label, and an optional detector list."""

    name: str
    label: str
    weights: tuple[str | None, ...]
    kind: str = "supervised"
    head: str | None = None
    model_kwargs: dict = field(default_factory=dict)
    taps: bool | None = False
    #: GL-MCM: store its patch readouts (``features.patchreadout``) for the ID names and each gl_mcm tau
    patch_features: bool = False
    #: also store the full (N, P, E) value-path patch tokens (float16)
    full_patch_features: bool = False
    features: dict = field(default_factory=dict)
    detectors: tuple[DetectorSpec, ...] | None = None
    #: True: the hub weights the name names; False: random init, chosen; None: not said (then
    #: ``weights`` or precomputed ``features`` must cover every extraction)
    pretrained: bool | None = None
    #: the network passes to extract (``features.pass_options``; ``odin = {...}`` in the model table)
    passes: tuple[PassSpec, ...] = ()
    #: a deep ensemble of the models with these labels (``ensemble = [...]``; no extraction of its own)
    ensemble: tuple[str, ...] = ()

    @property
    def random_init(self) -> bool:
        """True when this model extracts with random weights (``pretrained = false`` and no weights file)."""
        return self.pretrained is False and self.weights == (None,)

    def weights_for(self, seed_index: int) -> str | None:
        """The weights of the run with the given seed position (one shared file or one per seed)."""
        return self.weights[0] if len(self.weights) == 1 else self.weights[seed_index]


@dataclass(frozen=True)
class ExperimentConfig:
    """A validated experiment. Build with :func:`load_config`."""

    models: tuple[ModelSpec, ...]
    id_test: ExperimentDataset
    ood: tuple[ExperimentDataset, ...]
    id_train: ExperimentDataset | None = None
    #: covariate-shifted ID sets (full-spectrum OOD: counted as ID in the ``fs_*`` metrics)
    csid: tuple[ExperimentDataset, ...] = ()
    detectors: tuple[DetectorSpec, ...] | None = None
    zeroshot: tuple[DetectorSpec, ...] | None = None
    seeds: tuple[int, ...] = (0,)
    store: Path = Path("store")
    results: Path = Path("results.parquet")
    data_root: Path | None = None
    bootstrap_draws: int = 1000
    bootstrap_fixed_id: bool = True
    device: str = "auto"
    #: where the detectors compute (their ``device`` unless a detector sets its own): None = numpy
    #: (default), "auto" = the experiment's ``device``, or "cpu" / "cuda" / "cuda:N" (torch there)
    detector_device: str | None = None
    batch_size: int = 64
    num_workers: int = 0
    #: key the feature cache by every byte of every image (default: size, mtime and sampled bytes; docs/extraction.md)
    full_image_hash: bool = False
    retry_failed: bool = True
    seed_detectors: bool = False
    sweeps: tuple[SweepSpec, ...] = ()
    selection: SelectionSpec | None = None
    id_classes: Path | None = None
    name: str = "experiment"
    eoe_prompts: Path | None = None
    #: not a file key: whether extraction shows progress bars (``run_experiment(progress=...)``)
    progress: bool = True
    #: not a file key: the experiment file's folder when the file names code of its own
    #: (``module:factory``, ``module:Class``); put on ``sys.path`` here and by every distributed worker
    code_dir: Path | None = None

    def detectors_for(self, model: ModelSpec) -> tuple[DetectorSpec, ...] | None:
        """The detector list of ``model``: its own, else the experiment's list for its kind
        (``detectors`` or ``zeroshot``); None when none is given (every supported one runs)."""
        return model.detectors or (self.detectors if model.kind == "supervised" else self.zeroshot)


def _fail(where: str, msg: str) -> InputError:
    return InputError(f"experiment file: {where}: {msg}")


def _check_keys(table: Any, allowed: set[str], where: str) -> dict:
    if not isinstance(table, dict):
        raise _fail(where, f"expected a table, got {type(table).__name__}")
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise _fail(where, f"unknown key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(allowed))}")
    return table


def _typed(table: dict, key: str, types: type | tuple, where: str, default: Any = None, required: bool = False) -> Any:
    if key not in table:
        if required:
            raise _fail(where, f"missing required key {key!r}")
        return default
    value = table[key]
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise _fail(where, f"{key!r} must be {_names(types)}, got a boolean")
    if not isinstance(value, types):
        raise _fail(where, f"{key!r} must be {_names(types)}, got {type(value).__name__} {value!r}")
    return value


def _names(types: type | tuple) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join({"str": "a string", "int": "an integer", "bool": "true/false", "dict": "a table", "list": "a list"}.get(t.__name__, t.__name__) for t in types)


def _path(value: str | None, base: Path) -> Path | None:
    if value is None:
        return None
    p = Path(value).expanduser()
    return p if p.is_absolute() else base / p


def _id_classes(value: str | None, base: Path) -> Path | None:
    """``imagenet1k`` names the built-in class list and stays as it is; anything else is a file path."""
    return Path(value) if value == "imagenet1k" else _path(value, base)


def _dataset_name(value: str, base: Path) -> str:
    """A registry name stays as it is; a relative path (one with a ``/``, or one that exists beside
    the file) is made absolute against the file's folder."""
    p = Path(value).expanduser()
    if not p.is_absolute() and ("/" in value or (base / p).exists()):
        return str(base / p)
    return value


def _default_label(value: str) -> str:
    return Path(value).name if ("/" in value or "\\" in value) else value


def _dataset(entry: Any, where: str, base: Path, split_column: str | None) -> ExperimentDataset:
    if isinstance(entry, str):
        return ExperimentDataset(_dataset_name(entry, base), _default_label(entry), split_column)
    t = _check_keys(entry, _OOD, where)
    name = _typed(t, "name", str, where, required=True)
    return ExperimentDataset(
        _dataset_name(name, base),
        _typed(t, "label", str, where, _default_label(name)),
        _typed(t, "split_column", str, where, split_column),
        _typed(t, "group", str, where),
    )


def _openood(t: dict, base: Path) -> dict:
    """``[openood] benchmark = "cifar10", root = "DIR"``: the ``[datasets]`` table of an OpenOOD v1.5
    benchmark read from an OpenOOD data root as it lies (:func:`oodeval.data.openood.experiment_datasets`)."""
    if "datasets" in t:
        raise _fail("top level", "give [openood] (an OpenOOD benchmark's datasets) or [datasets], not both")
    o = _check_keys(t["openood"], _OPENOOD, "[openood]")
    benchmark = _typed(o, "benchmark", str, "[openood]", required=True)
    try:
        return experiment_datasets(_path(_typed(o, "root", str, "[openood]", required=True), base), benchmark,
                                   full_spectrum=_typed(o, "full_spectrum", bool, "[openood]", False))  # fmt: skip
    except UnknownNameError as exc:
        raise _fail("[openood]", exc.args[0]) from None


def _detector(entry: Any, where: str, known: set[str], base: Path, zeroshot: bool, problems: list[str],
              profile: str | None = None) -> DetectorSpec:  # fmt: skip
    if isinstance(entry, str):
        entry = {"name": entry}
    t = _check_keys(entry, _DETECTOR, where)
    name = given = _typed(t, "name", str, where, required=True)
    if not zeroshot and name in _registry(False):
        name = _registry(False).canonical(name)  # a peer's name (ebo, EnergyBased) as oodeval's
    if not zeroshot and ":" in name and name not in known:
        try:
            name = registry_name(name)
        except ValueError as exc:
            raise _fail(where, str(exc)) from None
        known = known | {name}
    if name not in known:
        what = "zero-shot scorer" if zeroshot else "detector"
        raise _fail(where, f"unknown {what} {name!r}; known: {', '.join(sorted(known))}")
    hp = _typed(t, "hyperparameters", dict, where, {})
    search = t.get("search", {})
    if zeroshot and ("defaults" in t or isinstance(search, str)):
        raise _fail(where, "defaults profiles (and a profile's sweep grid) apply to post-hoc detectors only")
    if not zeroshot:  # the defaults profile: its own, else its peer's name's, else the experiment's (in `hyperparameters`)
        own = _typed(t, "defaults", str, where)
        own = own if own is not None else search if isinstance(search, str) and profiles.KEY not in hp else None
        try:
            _, hp = profiles.resolve_profile(given, profile, {**hp, **({profiles.KEY: own} if own is not None else {})})
            if isinstance(search, str):  # a profile's sweep grid (OpenOOD's APS lists)
                search = profiles.sweep_grid(name, search)
        except InputError as exc:
            raise _fail(where, str(exc)) from None
    problems += _hyperparameter_problems(name, {k: v for k, v in hp.items() if k != profiles.KEY}, where, zeroshot)
    vocab = _typed(t, "vocabulary", str, where)
    if not zeroshot and vocab is not None:
        raise _fail(where, "vocabulary applies to zero-shot scorers (the `zeroshot` list) only")
    if zeroshot and _registry(True)[name].uses_negatives != (vocab is not None):
        raise _fail(where, f"{name!r} needs a `vocabulary` (a Vocabulary JSON or a text file)" if vocab is None
                    else f"{name!r} takes no vocabulary; only {', '.join(n for n, c in _registry(True).items() if c.uses_negatives)} do")
    search = _typed({"search": search}, "search", dict, where, {})
    bad = sorted(k for k, v in search.items() if not isinstance(v, list) or not v)
    if bad:
        raise _fail(where, f"search values must be non-empty lists of candidates; bad: {', '.join(bad)}")
    problems += _hyperparameter_problems(name, search, f"{where} search", zeroshot, candidates=True)
    both = sorted(set(search) & set(hp))
    if both:
        raise _fail(where, f"{', '.join(both)} set both in hyperparameters and in search; give each in one place")
    return DetectorSpec(name, dict(hp), _typed(t, "label", str, where, ""), None if vocab is None else str(_path(vocab, base)), dict(search))


def _registry(zeroshot: bool) -> dict:
    """name -> class of the post-hoc detectors, or of the zero-shot scorers."""
    return SCORERS if zeroshot else DETECTORS


def _hyperparameter_problems(name: str, hp: dict, where: str, zeroshot: bool, candidates: bool = False) -> list[str]:
    """What the declared constraints of the detector (or scorer) refuse in ``hp``: unknown names with
    "did you mean", renamed ones, values out of range (with ``candidates``, every candidate of a
    search), as ``where: ...`` sentences."""
    return [f"{where}: {p}" for p in check_hyperparameters(_registry(zeroshot)[name], hp, candidates)]


def _generations(entry: Any, where: str) -> list:
    """``entry`` once, or, with ``generations = N``, once per generation g = 0..N-1 with ``{g}`` of
    its vocabulary path replaced by g (repeated LLM generations of one vocabulary, paper Tab. 2).
    The file stem must end in ``-gen{g}`` so that results and report group the generations."""
    if not isinstance(entry, dict):
        return [entry]
    vocab = entry.get("vocabulary")
    if "generations" not in entry:
        if isinstance(vocab, str) and GENERATION in vocab:
            raise _fail(where, f"vocabulary {vocab!r} holds {GENERATION} but no `generations = N` says how many")
        return [entry]
    n = entry["generations"]
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise _fail(where, f"generations must be a whole number >= 1, got {n!r}")
    if not isinstance(vocab, str) or not Path(vocab).stem.endswith(f"-gen{GENERATION}"):
        raise _fail(where, f"generations needs a vocabulary path whose file name ends in '-gen{GENERATION}' "
                    f"(e.g. vocab/GPT-gen{GENERATION}.json), got {vocab!r}")
    rest = {k: v for k, v in entry.items() if k != "generations"}
    return [{**rest, "vocabulary": vocab.replace(GENERATION, str(g))} for g in range(n)]


def _detectors(value: Any, where: str, base: Path, problems: list[str], zeroshot: bool = False,
               profile: str | None = None) -> tuple[DetectorSpec, ...] | None:  # fmt: skip
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise _fail(where, "must be a non-empty list of detector names or tables")
    known = _registry(zeroshot)
    expanded = [(f"{where}[{i}]", e) for i, raw in enumerate(value) for e in _generations(raw, f"{where}[{i}]")]
    specs = tuple(_detector(e, w, set(known), base, zeroshot, problems, profile) for w, e in expanded)
    seen: dict[tuple, int] = {}
    for i, s in enumerate(specs):
        k = (s.name, tuple(sorted((str(a), str(b)) for a, b in s.hyperparameters.items())), s.vocabulary, s.label)
        if k in seen:
            raise _fail(where, f"entries {seen[k]} and {i} configure the same detector {s.name!r} twice")
        seen[k] = i
    return specs


def _model(entry: Any, i: int, base: Path, n_seeds: int, problems: list[str], profile: str | None = None) -> ModelSpec:
    where = f"[[models]] #{i + 1}"
    t = _check_keys(entry, _MODEL, where)
    if "ensemble" in t:
        return _ensemble_model(t, where, base, problems, profile)
    name = _typed(t, "name", str, where, required=True)
    kind = _typed(t, "kind", str, where, "supervised")
    if kind not in KINDS:
        raise _fail(where, f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    weights = t.get("weights")
    if weights is None or isinstance(weights, str):
        wt: tuple = (None if weights is None else str(_path(weights, base)),)
    elif isinstance(weights, list) and all(isinstance(w, str) for w in weights):
        if len(weights) != n_seeds:
            raise _fail(where, f"weights lists {len(weights)} files but there are {n_seeds} seeds; give one per seed or a single file")
        wt = tuple(str(_path(w, base)) for w in weights)
    else:
        raise _fail(where, f"weights must be a path or a list of paths (one per seed), got {weights!r}")
    pretrained = _typed(t, "pretrained", bool, where, None)
    if pretrained is not None and wt != (None,):
        raise _fail(where, "give either weights (local files) or pretrained (true: hub weights, false: random init), not both")
    feats = _typed(t, "features", dict, where, {})
    bad = [k for k, v in feats.items() if not isinstance(v, str)]
    if bad:
        raise _fail(where, f"features values must be FeatureSet folder paths; bad entries: {', '.join(bad)}")
    return ModelSpec(
        name=name,
        label=_typed(t, "label", str, where, name),
        weights=wt,
        pretrained=pretrained,
        head=None if t.get("head") is None else str(_path(_typed(t, "head", str, where), base)),
        kind=kind,
        model_kwargs=dict(_typed(t, "model_kwargs", dict, where, {})),
        taps=_typed(t, "taps", bool, where, None),
        patch_features=_typed(t, "patch_features", bool, where, False),
        full_patch_features=_typed(t, "full_patch_features", bool, where, False),
        features={k: str(_path(v, base)) for k, v in feats.items()},
        detectors=_detectors(t.get("detectors"), f"{where} detectors", base, problems, zeroshot=kind == "zero-shot", profile=profile),
        passes=_passes(t, where, kind),
    )


def _passes(t: dict, where: str, kind: str) -> tuple[PassSpec, ...]:
    """The model table's network passes (``odin = {temperature = 1000}``, ``rankfeat = true``, ...)."""
    out = []
    for name in PASS_KINDS:
        try:
            spec = parse_pass(name, t.get(name))
        except InputError as exc:
            raise _fail(where, str(exc)) from None
        if spec is None:
            continue
        if kind != "supervised":
            raise _fail(where, f"{name}: the network passes apply to supervised classifiers")
        if name == "mds" and spec.get("fit") is not None:
            raise _fail(where, "mds: fit is the experiment's id_train set (oodeval run extracts and fits it); leave fit out")
        out.append(spec)
    return tuple(out)


def _names_code(t: dict) -> bool:
    """Whether the file names code of its own: a ``package.module:factory`` model or a ``module:Class`` detector."""
    models = [m.get("name", "") for m in t.get("models", []) if isinstance(m, dict)]
    dets = [d if isinstance(d, str) else d.get("name", "") for d in t.get("detectors") or [] if isinstance(d, str | dict)]
    dets += [d if isinstance(d, str) else d.get("name", "") for m in t.get("models", []) if isinstance(m, dict)
             for d in m.get("detectors") or [] if isinstance(d, str | dict)]  # fmt: skip
    return any(isinstance(n, str) and ":" in n and not n.startswith(("timm:", "open_clip:", "hf:", "openood:")) for n in models + dets)


def _importable(t: dict, base: Path) -> Path | None:
    """Put the experiment file's own folder on ``sys.path`` (first) when the file names code of its
    own, so ``my_models:net`` beside it imports without ``PYTHONPATH=.``; returns that folder (None
    when the file names no code), which workers put on their path (:func:`code_on_path`)."""
    if not _names_code(t):
        return None
    code_on_path(base)
    return base


def code_on_path(folder: Path | None) -> None:
    """Put ``folder`` (an experiment's ``code_dir``) first on ``sys.path`` unless it is there already."""
    import sys

    if folder is not None and str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


def _check_weights_chosen(m: ModelSpec, has_train: bool, ood_labels: list[str]) -> None:
    """Refuse a model that would extract (a role without a precomputed FeatureSet) with no weights
    chosen: no silent random init (docs/experiments.md)."""
    roles = ["id_test", *ood_labels] + (["id_train"] if has_train and m.kind == "supervised" else [])
    roles += ["text:id"] if m.kind == "zero-shot" else []
    missing = [r for r in roles if r not in m.features]
    if missing and m.weights == (None,) and m.pretrained is None:
        raise _fail(f"model {m.label!r}", f"no weights chosen for extracting {', '.join(missing)}; add weights = \"FILE\" "
                    "(a local checkpoint), pretrained = true (the hub weights the name names) or pretrained = false "
                    "(random init, on purpose)")


def _sweep(entry: Any, i: int, base: Path, problems: list[str]) -> SweepSpec:
    where = f"[[sweeps]] #{i + 1}"
    t = _check_keys(entry, _SWEEP, where)
    sizes = _typed(t, "sizes", list, where, required=True)
    if not sizes or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in sizes):
        raise _fail(where, f"sizes must be a non-empty list of integers >= 0, got {sizes!r}")
    scorer = _typed(t, "scorer", str, where, "neglabel")
    reg = _registry(True)
    if scorer not in reg or not reg[scorer].uses_negatives:
        raise _fail(where, f"scorer must be a vocabulary scorer ({', '.join(n for n, c in reg.items() if c.uses_negatives)}), got {scorer!r}")
    hp = _typed(t, "hyperparameters", dict, where, {})
    problems += _hyperparameter_problems(scorer, hp, where, True)
    kind = _typed(t, "kind", str, where, "prefix")
    if kind not in ("prefix", "siblings"):
        raise _fail(where, f"kind must be 'prefix' (first M labels, Fig. A2) or 'siblings' (k per ID class, Fig. A1/A3), got {kind!r}")
    return SweepSpec(
        _typed(t, "name", str, where, required=True),
        str(_path(_typed(t, "vocabulary", str, where, required=True), base)),
        tuple(sizes),
        scorer,
        dict(hp),
        kind,
        _typed(t, "seed", int, where, 0),
    )


def _selection(value: Any, base: Path, id_test: ExperimentDataset, ood: tuple[ExperimentDataset, ...]) -> SelectionSpec | None:
    if value is None:
        return None
    t = _check_keys(value, _SELECTION, "[selection]")
    vid = _dataset(_typed(t, "validation_id", str, "[selection]", required=True), "[selection] validation_id", base, None)
    vood = _dataset(_typed(t, "validation_ood", str, "[selection]", required=True), "[selection] validation_ood", base, None)
    if vid.name == id_test.name:
        raise _fail("[selection]", f"validation_id {vid.name!r} is the test ID set; choose hyperparameters on a separate ID split")
    tests = {d.name for d in ood} | {d.label for d in ood}
    if vood.name in tests or vood.label in tests:
        raise _fail("[selection]", f"validation_ood {vood.name!r} is one of the test OOD sets; choose hyperparameters on a separate OOD set")
    return SelectionSpec(replace(vid, label="validation_id"), replace(vood, label="validation_ood"))


def _default_taps(model: ModelSpec, detectors: tuple[DetectorSpec, ...] | None) -> ModelSpec:
    """``taps`` left unset: on for a supervised model whose explicit detector list names a detector
    that fits on tapped rows (its class declares ``fits_on``: NAC)."""
    if model.taps is not None:
        return model

    listed = model.detectors or detectors or ()
    return replace(model, taps=model.kind == "supervised" and any(d.name in REGISTRY and REGISTRY[d.name].fits_on is not None for d in listed))


def _read(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"experiment file {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8-sig")  # a BOM (Windows editors) is not part of the TOML
    except UnicodeDecodeError as exc:
        raise InputError(f"experiment file {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from exc
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise InputError(f"experiment file {path} is not valid YAML: {exc}") from exc
    elif path.suffix.lower() == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise InputError(f"experiment file {path} is not valid TOML: {exc}") from exc
    else:
        raise InputError(f"experiment file {path} must end in .toml, .yaml or .yml")
    if not isinstance(data, dict):
        raise InputError(f"experiment file {path} must hold a table at the top level")
    return data


def load_config(source: str | Path | dict | ExperimentConfig, base_dir: str | Path | None = None,
                defaults: str | None = None) -> ExperimentConfig:
    """Validate an experiment file (path) or an already-parsed dict; raise ValueError naming the problem.

    ``base_dir`` anchors relative paths (default: the file's folder, or the current folder for a dict).
    ``defaults`` (``oodeval run --defaults``) replaces the file's top-level ``defaults`` profile.
    """
    if isinstance(source, ExperimentConfig):
        return source
    if isinstance(source, dict):
        data, base = source, Path(base_dir or ".").resolve()
    else:
        path = Path(source)
        data, base = _read(path), Path(base_dir or path.parent).resolve()
    t = _check_keys(data, _TOP, "top level")
    profile = defaults if defaults is not None else _typed(t, "defaults", str, "top level")
    if profile is not None:
        try:
            profiles.check_profile(profile)
        except InputError as exc:
            raise _fail("top level", str(exc)) from None
    code_dir = _importable(t, base)
    seeds = _typed(t, "seeds", list, "top level", [0])
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise _fail("top level", f"seeds must be a non-empty list of integers, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise _fail("top level", f"seeds repeat a value: {seeds!r}")
    ds = _openood(t, base) if "openood" in t else _check_keys(_typed(t, "datasets", dict, "top level", required=True), _DATASETS, "[datasets]")
    split_column = _typed(ds, "split_column", str, "[datasets]")
    ood_raw = _typed(ds, "ood", list, "[datasets]", required=True)
    if not ood_raw:
        raise _fail("[datasets]", "ood must list at least one OOD dataset")
    ood = tuple(_dataset(e, f"[datasets] ood[{i}]", base, split_column) for i, e in enumerate(ood_raw))
    labels = [d.label for d in ood]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise _fail("[datasets]", f"OOD dataset label(s) used twice: {', '.join(dup)}; give each a distinct label")
    clash = sorted(set(labels) & set(_ROLES))
    if clash:
        raise _fail("[datasets]", f"OOD labels may not be {', '.join(clash)}")
    csid = tuple(_dataset(e, f"[datasets] csid[{i}]", base, None) for i, e in enumerate(_typed(ds, "csid", list, "[datasets]", [])))
    csid_labels = [d.label for d in csid]
    dup = sorted({x for x in csid_labels if csid_labels.count(x) > 1 or x in labels or x in _ROLES})
    if dup:
        raise _fail("[datasets]", f"csID label(s) {', '.join(dup)} repeat or clash with an OOD label or a role; give each a distinct label")
    id_test = _dataset(_typed(ds, "id_test", str, "[datasets]", required=True), "[datasets] id_test", base, None)
    id_train_raw = _typed(ds, "id_train", str, "[datasets]")
    id_train = None if id_train_raw is None else _dataset(id_train_raw, "[datasets] id_train", base, None)
    models_raw = _typed(t, "models", list, "top level", required=True)
    if not models_raw:
        raise _fail("top level", "models must list at least one [[models]] table")
    problems: list[str] = []  # hyperparameter and device values, collected to be refused together
    models = tuple(_model(m, i, base, len(seeds), problems, profile) for i, m in enumerate(models_raw))
    mlabels = [(m.label) for m in models]
    dup = sorted({x for x in mlabels if mlabels.count(x) > 1})
    if dup:
        raise _fail("[[models]]", f"model label(s) used twice: {', '.join(dup)}; set `label` to tell them apart")
    needs_train = [m.label for m in models if m.kind == "supervised" and not m.ensemble]  # an ensemble's members fit
    if needs_train and id_train is None and not all("id_train" in m.features for m in models if m.kind == "supervised" and not m.ensemble):
        raise _fail("[datasets]", f"id_train is required to fit the detectors of supervised model(s) {', '.join(needs_train)}")
    allowed_feats = set(_ROLES) | set(labels) | set(csid_labels) | {"validation_id", "validation_ood"}
    for m in models:
        bad = sorted(k for k in set(m.features) - allowed_feats if not (k.startswith("text:") and m.kind == "zero-shot"))
        if bad:
            raise _fail(
                f"model {m.label!r} features",
                f"unknown dataset(s) {', '.join(bad)}; use id_train, id_test, an OOD label ({', '.join(labels)})"
                " or, for a zero-shot model, text:id / text:<vocabulary> label embeddings",
            )
    _check_ensembles(models)
    for m in models:
        if not m.ensemble:
            _check_weights_chosen(m, id_train is not None, labels)
    detectors = _detectors(t.get("detectors"), "detectors", base, problems, profile=profile)
    zeroshot = _detectors(t.get("zeroshot"), "zeroshot", base, problems, zeroshot=True)
    sweeps = tuple(_sweep(e, i, base, problems) for i, e in enumerate(_typed(t, "sweeps", list, "top level", [])))
    device = _typed(t, "device", str, "top level", "auto")
    detector_device = _typed(t, "detector_device", str, "top level")
    for key, value in (("device", device), ("detector_device", detector_device)):
        if value is not None and value != "auto" and not Device().accepts(value):
            problems.append(f"top level: {key}={value!r} must be 'auto' or {Device()}")
    if problems:
        raise InputError(f"experiment file: {len(problems)} problem(s) with hyperparameters or devices:\n"
                         + "\n".join(f"  - {p}" for p in problems))
    models = tuple(_default_taps(m, detectors) for m in models)
    draws = _typed(t, "bootstrap_draws", int, "top level", 1000)
    if draws < 1:
        raise _fail("top level", f"bootstrap_draws must be positive, got {draws}")
    batch = _typed(t, "batch_size", int, "top level", 64)
    if batch < 1:
        raise _fail("top level", f"batch_size must be positive, got {batch}")
    selection = _selection(t.get("selection"), base, id_test, ood)
    searching = [d.name for d in (detectors or ()) + tuple(d for m in models for d in (m.detectors or ())) + (zeroshot or ()) if d.search]
    if searching and selection is None:
        raise _fail("top level", f"detector(s) {', '.join(searching)} declare a search but there is no [selection] table with validation_id and validation_ood")
    return ExperimentConfig(
        models=models,
        selection=selection,
        id_test=id_test,
        ood=ood,
        csid=csid,
        id_train=id_train,
        detectors=detectors,
        sweeps=sweeps,
        zeroshot=zeroshot,
        seeds=tuple(seeds),
        store=_path(_typed(t, "store", str, "top level", "store"), base),
        results=_path(_typed(t, "results", str, "top level", "results.parquet"), base),
        data_root=_path(_typed(t, "data_root", str, "top level"), base),
        bootstrap_draws=draws,
        bootstrap_fixed_id=_typed(t, "bootstrap_fixed_id", bool, "top level", True),
        device=device,
        detector_device=detector_device,
        batch_size=batch,
        num_workers=_typed(t, "num_workers", int, "top level", 0),
        full_image_hash=_typed(t, "full_image_hash", bool, "top level", False),
        retry_failed=_typed(t, "retry_failed", bool, "top level", True),
        seed_detectors=_typed(t, "seed_detectors", bool, "top level", False),
        id_classes=_id_classes(_typed(ds, "id_classes", str, "[datasets]"), base),
        name=_typed(t, "name", str, "top level", "experiment"),
        eoe_prompts=_path(_typed(t, "eoe_prompts", str, "top level"), base),
        code_dir=code_dir,
    )


_ENSEMBLE = {"ensemble", "label", "name", "detectors"}


def _ensemble_model(t: dict, where: str, base: Path, problems: list[str], profile: str | None) -> ModelSpec:
    """A model table ``ensemble = ["LABEL", ...]``: a deep ensemble of the grid's models with those
    labels (each with all its weights files, one per seed where it has several), scored by
    ``deep_ensemble`` (or the table's own ``detectors``) from the members' stored FeatureSets
    (:func:`oodeval.features.ensemble.ensemble_featureset`)."""
    bad = sorted(set(t) - _ENSEMBLE)
    if bad:
        raise _fail(where, f"an ensemble model table takes only {', '.join(sorted(_ENSEMBLE))}; {', '.join(bad)} belong to its members")
    members = t["ensemble"]
    if not (isinstance(members, list) and members and all(isinstance(m, str) for m in members)) or len(set(members)) != len(members):
        raise _fail(where, f"ensemble must list distinct model labels, got {members!r}")
    detectors = _detectors(t.get("detectors", ["deep_ensemble"]), f"{where} detectors", base, problems, profile=profile)
    label = _typed(t, "label", str, where, "ensemble(" + "+".join(members) + ")")
    return ModelSpec(name=_typed(t, "name", str, where, "ensemble"), label=label, weights=(None,), detectors=detectors,
                     ensemble=tuple(members))  # fmt: skip


def _check_ensembles(models: tuple[ModelSpec, ...]) -> None:
    """Each ensemble's members are supervised models of the grid, not ensembles, two or more runs in all."""
    by_label = {m.label: m for m in models}
    for m in models:
        if not m.ensemble:
            continue
        unknown = [x for x in m.ensemble if x not in by_label]
        if unknown:
            raise _fail(f"model {m.label!r}", f"ensemble member(s) {', '.join(unknown)} are not model labels of this file ({', '.join(by_label)})")
        odd = [x for x in m.ensemble if by_label[x].ensemble or by_label[x].kind != "supervised"]
        if odd:
            raise _fail(f"model {m.label!r}", f"ensemble member(s) {', '.join(odd)} must be supervised classifiers, not ensembles or zero-shot models")
        runs = sum(len(set(by_label[x].weights)) for x in m.ensemble)
        if runs < 2:
            raise _fail(f"model {m.label!r}", "an ensemble needs two or more members: list two models, or one with a weights file per seed")
