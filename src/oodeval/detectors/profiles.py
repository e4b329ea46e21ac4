"""Named defaults profiles: each detector's hyperparameters as the paper, OpenOOD v1.5 and pytorch-ood 0.4 set them.

A profile is chosen with ``--defaults paper|openood|pytorch-ood`` (``score``, ``evaluate``,
``run``), ``defaults = "..."`` in an experiment (top level or per detector), or the
pseudo-hyperparameter ``defaults`` of one detector (``--set knn.defaults=openood``). ``paper`` is
each class's own defaults (the paper's, with the backbone's release defaults,
:mod:`oodeval.detectors.defaults`); ``openood`` / ``pytorch-ood`` overlay the values of
:data:`TABLE`; explicit hyperparameters override both. A peer's name for a detector (``ash``,
``KNN``, ``temp_scaling``: :mod:`oodeval.detectors.peer_names`) selects that peer's profile unless
the detector is given a profile of its own (:func:`resolve_profile`).

:data:`TABLE` maps detector -> profile -> :class:`PeerEntry` (the values, each with its source,
OpenOOD's ``postprocessor_sweep`` grid, a note), or None where the peer lacks the method; a
detector absent from it has no peer. OpenOOD's values are read from its
``configs/postprocessors/<name>.yml`` and ``openood/postprocessors/*_postprocessor.py`` at commit
:data:`OPENOOD_COMMIT`; pytorch-ood's from the constructors of ``pytorch_ood.detector`` 0.4.0
(percentiles given there as fractions are written here in percent, as oodeval takes them).
docs/detectors.md ("Defaults profiles") is this table, written out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import InputError
from .base import Default

__all__ = ["PROFILES", "PAPER", "KEY", "TABLE", "PeerEntry", "OPENOOD_COMMIT", "PYTORCH_OOD_VERSION", "check_profile",
           "entry", "profile_defaults", "sweep_grid", "resolve_profile", "split_profile", "peer_profile"]

PAPER, OPENOOD, PYTORCH_OOD = "paper", "openood", "pytorch-ood"
#: the profiles, the first the default
PROFILES = (PAPER, OPENOOD, PYTORCH_OOD)
#: the pseudo-hyperparameter naming a detector's profile (popped before the detector is built)
KEY = "defaults"
#: the OpenOOD commit its files were read at (github.com/Jingkang50/OpenOOD)
OPENOOD_COMMIT = "3c35632ee91b"
PYTORCH_OOD_VERSION = "0.4.0"
#: whose name an alias is (:meth:`oodeval.registry.Registry.aliases`) -> that peer's profile
_ALIAS_SOURCES = {"OpenOOD v1.5": OPENOOD, "pytorch-ood": PYTORCH_OOD}


@dataclass(frozen=True)
class PeerEntry:
    """One peer's settings of one detector: ``values`` (hyperparameter -> :class:`Default`, value
    and source), ``sweep`` (OpenOOD's ``postprocessor_sweep``: hyperparameter -> candidates, in
    oodeval's names), a ``note`` on what the table cannot express and the ``source`` read."""

    values: Mapping[str, Default] = field(default_factory=dict)
    sweep: Mapping[str, tuple] = field(default_factory=dict)
    note: str = ""
    source: str = ""


def _oo(file: str, values: dict | None = None, sweep: dict | None = None, note: str = "") -> PeerEntry:
    src = f"OpenOOD {file} @{OPENOOD_COMMIT}"
    return PeerEntry({k: Default(v, src) for k, v in (values or {}).items()}, {k: tuple(v) for k, v in (sweep or {}).items()}, note, src)


def _po(cls: str, values: dict | None = None, note: str = "", module: str | None = None) -> PeerEntry:
    src = f"pytorch-ood {PYTORCH_OOD_VERSION} pytorch_ood/detector/{module or cls.lower()}.py {cls}"
    return PeerEntry({k: Default(v, src) for k, v in (values or {}).items()}, {}, note, src)


_PASS = "set by its extraction pass (docs/detectors.md, methods that need the network)"
_PCT = [65, 70, 75, 80, 85, 90, 95]

#: detector -> profile -> the peer's settings (None: the peer lacks the method); ``paper`` is the class defaults
TABLE: dict[str, dict[str, PeerEntry | None]] = {
    "msp": {OPENOOD: _oo("configs/postprocessors/msp.yml", {"temperature": 1.0}),
            PYTORCH_OOD: _po("MaxSoftmax", {"temperature": 1.0}, module="softmax")},
    "maxlogit": {OPENOOD: _oo("configs/postprocessors/mls.yml"), PYTORCH_OOD: _po("MaxLogit")},
    "kl_matching": {OPENOOD: _oo("configs/postprocessors/klm.yml"), PYTORCH_OOD: _po("KLMatching")},
    "energy": {OPENOOD: _oo("configs/postprocessors/ebo.yml", {"temperature": 1.0}, {"temperature": [1.0]}),
               PYTORCH_OOD: _po("EnergyBased", {"temperature": 1.0}, module="energy")},
    "gen": {OPENOOD: _oo("configs/postprocessors/gen.yml", {"gamma": 0.1, "top_m": 100},
                         {"gamma": [0.01, 0.1, 0.5, 1, 2, 5, 10], "top_m": [10, 50, 100, 200, 500, 1000]}),
            PYTORCH_OOD: _po("GEN", {"gamma": 0.1, "top_m": None}, note="M=None: every class")},
    "react": {OPENOOD: _oo("configs/postprocessors/react.yml", {"percentile": 90.0}, {"percentile": [85, 90, 95, 99]}),
              PYTORCH_OOD: _po("ReAct", {"percentile": 90.0})},
    "ash_s": {OPENOOD: None, PYTORCH_OOD: _po("ASH", {"percentile": 65.0}, note="variant='ash-s' (its default)")},
    "ash_b": {OPENOOD: _oo("configs/postprocessors/ash.yml", {"percentile": 90.0}, {"percentile": _PCT},
                           note="OpenOOD's ash is ASH-B (ash_postprocessor.py)"),
              PYTORCH_OOD: _po("ASH", {"percentile": 65.0}, note="variant='ash-b'")},
    "ash_p": {OPENOOD: None, PYTORCH_OOD: _po("ASH", {"percentile": 65.0}, note="variant='ash-p'")},
    "scale": {OPENOOD: _oo("configs/postprocessors/scale.yml", {"percentile": 85.0}, {"percentile": _PCT}),
              PYTORCH_OOD: _po("SCALE", {"percentile": 65.0})},
    "dice": {OPENOOD: _oo("configs/postprocessors/dice.yml", {"percentile": 90.0}, {"percentile": [90]}),
             PYTORCH_OOD: _po("DICE", note="p has no default (a required argument): the paper's value is kept")},
    "vra": {OPENOOD: _oo("configs/postprocessors/vra.yml", {"low": 10.0, "high": 90.0, "per_dim": False},
                         {"high": [85, 90, 95, 99], "low": [1, 5, 10, 15]}, note="percentiles over all entries"),
            PYTORCH_OOD: _po("VRA", {"low": 1.0, "high": 99.0, "per_dim": True}, note="percentiles per feature dimension")},
    "mahalanobis": {OPENOOD: _oo("configs/postprocessors/mds.yml"), PYTORCH_OOD: _po("Mahalanobis")},
    "relative_mahalanobis": {OPENOOD: _oo("configs/postprocessors/rmds.yml"), PYTORCH_OOD: _po("RMD")},
    "knn": {OPENOOD: _oo("configs/postprocessors/knn.yml", {"k": 50}, {"k": [50, 100, 200, 500, 1000]}),
            PYTORCH_OOD: _po("KNN", {"k": 50}, note="normalize=True")},
    "fdbd": {OPENOOD: _oo("configs/postprocessors/fdbd.yml", note="distance_as_normalizer=True (swept over "
                          "[True, False]): oodeval's fdbd always divides by the distance to the mean"),
             PYTORCH_OOD: _po("fDBD")},
    "nac": {OPENOOD: _oo("(no nac config or postprocessor at this commit)", note="per-layer settings: the backbone defaults (the NAC release's)"),
            PYTORCH_OOD: _po("NACUE", note="m_bins 50, alpha 100, o_star 50 per layer: give them as layer_params", module="nac")},
    "vim": {OPENOOD: _oo("configs/postprocessors/vim.yml", {"dim": 256}, {"dim": [256, 1000]}),
            PYTORCH_OOD: _po("ViM", note="d has no default (a required argument): the paper's value is kept")},
    "nnguide": {OPENOOD: _oo("configs/postprocessors/nnguide.yml, openood/postprocessors/nnguide_postprocessor.py",
                             {"k": 100, "bank_fraction": 0.01, "bank": "first"}, {"k": [100], "bank_fraction": [0.01]},
                             note="the bank: the first alpha = 1% of the train loader"),
                PYTORCH_OOD: _po("NNGuide", {"k": 10, "bank_fraction": 1.0}, note="the bank: every row fit_features is given")},
    "odin": {OPENOOD: _oo("configs/postprocessors/odin.yml", note=_PASS), PYTORCH_OOD: _po("ODIN", note=_PASS)},
    "mahalanobis_ensemble": {OPENOOD: _oo("configs/postprocessors/mds_ensemble.yml", note=_PASS),
                             PYTORCH_OOD: _po("MahalanobisODIN", note=_PASS, module="mmahalanobis")},
    "gram": {OPENOOD: _oo("configs/postprocessors/gram.yml", note="powers: " + _PASS),
             PYTORCH_OOD: _po("Gram", {"assign": "label", "by_confidence": False}, note="powers: " + _PASS)},
    "rankfeat": {OPENOOD: _oo("configs/postprocessors/rankfeat.yml", note=_PASS), PYTORCH_OOD: _po("RankFeat", note=_PASS)},
    "mc_dropout": {OPENOOD: _oo("openood/postprocessors/dropout_postprocessor.py", {"mode": "logits"}, note="p, samples: " + _PASS),
                   PYTORCH_OOD: _po("MCD", {"mode": "var"}, note="samples: " + _PASS)},
    "residual": {OPENOOD: _oo("configs/postprocessors/residual.yml", {"dim": 512}), PYTORCH_OOD: None},
    "she": {OPENOOD: _oo("configs/postprocessors/she.yml", {"metric": "inner_product"}), PYTORCH_OOD: _po("SHE")},
    "relation": {OPENOOD: _oo("configs/postprocessors/relation.yml", {"pow": 1.0}, {"pow": [1, 2, 4, 6, 8]}), PYTORCH_OOD: None},
    "nci": {OPENOOD: _oo("configs/postprocessors/nci.yml", {"alpha": 1e-4}, {"alpha": [1e-4, 1e-3, 1e-2, 1e-1]}),
            PYTORCH_OOD: _po("NCI", {"alpha": 0.0})},
    "gmm": {OPENOOD: _oo("configs/postprocessors/gmm.yml", note="per-layer cluster counts and reductions of several layers: not expressed"),
            PYTORCH_OOD: None},
    "class_gmm": {OPENOOD: None, PYTORCH_OOD: _po("GMM", {"reg": 1e-6})},
    "entropy": {OPENOOD: None, PYTORCH_OOD: _po("Entropy")},
    "temperature_scaling": {
        OPENOOD: _oo("openood/postprocessors/temp_scaling_postprocessor.py", {"procedure": "openood", "val_fraction": 1.0},
                     note="L-BFGS lr 0.01 x 50 from T = 1.5 on every row it is given (its ID val split)"),
        PYTORCH_OOD: _po("TemperatureScaling", {"procedure": "pytorch-ood", "val_fraction": 1.0},
                         note="L-BFGS lr 0.01 x 50 from T = 1 on every row it is given", module="tscaling")},
    "openmax": {OPENOOD: _oo("openood/postprocessors/openmax_postprocessor.py",
                             {"tailsize": 20, "alpha": 3, "distance": "euclidean", "correct_only": True, "readout": "unknown"}),
                PYTORCH_OOD: _po("OpenMax", {"tailsize": 25, "alpha": 10, "distance": "euclidean", "correct_only": False, "readout": "unknown"},
                                 note="euclid_weight=1.0: Euclidean only", module="openmax/torch")},
    "gradnorm": {OPENOOD: _oo("openood/postprocessors/gradnorm_postprocessor.py", {"temperature": 1.0}),
                 PYTORCH_OOD: _po("GradNorm", {"temperature": 1.0})},
    "lts": {OPENOOD: None, PYTORCH_OOD: _po("LTS", {"p": 0.05})},
    "grad_uncertainty": {OPENOOD: None, PYTORCH_OOD: _po("GradUncertainty")},
}  # fmt: skip


def check_profile(profile: object, where: str = "defaults") -> str:
    """``profile`` if it is one of :data:`PROFILES`, else an InputError naming them."""
    if profile not in PROFILES:
        raise InputError(f"{where}={profile!r} is not a defaults profile; profiles: {', '.join(PROFILES)}")
    return profile  # type: ignore[return-value]


def entry(name: str, profile: str) -> PeerEntry | None:
    """Detector ``name``'s :class:`PeerEntry` under ``profile`` (an empty one for ``paper``); None
    where the peer lacks the method (then the paper's defaults apply)."""
    check_profile(profile)
    if profile == PAPER:
        return PeerEntry()
    return TABLE.get(name, {}).get(profile)


def profile_defaults(name: str, profile: str) -> dict[str, Default]:
    """The hyperparameters ``profile`` sets for detector ``name`` over its class defaults, with their sources."""
    found = entry(name, profile)
    return dict(found.values) if found is not None else {}


def sweep_grid(name: str, profile: str) -> dict[str, list]:
    """OpenOOD's ``postprocessor_sweep`` grid of detector ``name`` under ``profile`` (hyperparameter ->
    candidates) for the validation search; an InputError where the profile has none for it."""
    found = entry(name, profile)
    if found is None or not found.sweep:
        raise InputError(f"detector {name!r} has no {profile} sweep grid; grids: "
                         + ", ".join(f"{n} ({p})" for n, ps in TABLE.items() for p, e in ps.items() if e is not None and e.sweep))
    return {k: list(v) for k, v in found.sweep.items()}


def peer_profile(name: str) -> str | None:
    """The profile a peer's name selects (``ash`` -> openood, ``KNN`` -> pytorch-ood); None for
    oodeval's own names and unknown ones."""
    from . import REGISTRY

    alias = REGISTRY.aliases().get(name)
    return _ALIAS_SOURCES.get(alias[1]) if alias is not None else None


def resolve_profile(name: str, defaults: str | None = None, hyperparameters: Mapping | None = None) -> tuple[str, dict]:
    """``(profile, hyperparameters)`` of a detector spec: the profile is the spec's own ``defaults``
    hyperparameter, else the peer's whose name ``name`` is, else ``defaults`` (the run's; None:
    paper); the hyperparameters are returned with ``defaults`` set to it (left out for paper unless
    the spec named it), so the profile is part of the configuration's key and recorded with it,
    and resolving again under another run profile keeps it."""
    hp = dict(hyperparameters or {})
    own = hp.pop(KEY, None)
    profile = check_profile(own if own is not None else peer_profile(name) or defaults or PAPER,
                            f"detector {name!r}: defaults" if own is not None else "defaults")
    if profile != PAPER or own is not None:
        hp[KEY] = profile
    return profile, hp


def split_profile(hyperparameters: Mapping | None) -> tuple[str, dict]:
    """``(profile, the other hyperparameters)`` of a spec's hyperparameters (``defaults`` popped; paper when absent)."""
    hp = dict(hyperparameters or {})
    return check_profile(hp.pop(KEY, PAPER)), hp
