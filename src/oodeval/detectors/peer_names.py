"""The peers' names for oodeval's detectors: OpenOOD v1.5's postprocessor keys and pytorch-ood
0.4's detector classes, accepted wherever a detector name is (aliases, logged when resolved:
:meth:`oodeval.registry.Registry.canonical`), and the tags ``openood`` / ``pytorch-ood`` on the
detectors they name, so ``names("openood")`` lists every OpenOOD method oodeval runs.

OpenOOD's keys are those of ``openood/postprocessors/utils.py`` (``get_postprocessor``) plus the
later post-hoc additions (scale, nnguide, vra, nac) and the config name ``temp_scaling``, with
those that need the network (odin, mds_ensemble, gram, rankfeat, dropout: ``detectors.network``,
run through their extraction passes); its methods that need training (cider, npos, godin,
conf_branch, mcd (maximum classifier discrepancy), ...) are not here. docs/detectors.md ("The peers' names")
lists both tables and how the defaults differ.
"""

from __future__ import annotations

from . import REGISTRY

__all__ = ["OPENOOD", "PYTORCH_OOD", "PYTORCH_OOD_VARIANTS", "OPENOOD_SINCE"]

#: OpenOOD v1.5 postprocessor key -> oodeval detector
OPENOOD = {
    "msp": "msp", "ebo": "energy", "mls": "maxlogit", "klm": "kl_matching", "gen": "gen",
    "temp_scaling": "temperature_scaling", "temperature_scaling": "temperature_scaling",
    "openmax": "openmax", "gradnorm": "gradnorm",
    "react": "react", "ash": "ash_b", "scale": "scale", "dice": "dice", "vra": "vra",
    "mds": "mahalanobis", "rmds": "relative_mahalanobis", "gmm": "gmm", "knn": "knn", "she": "she",
    "residual": "residual", "fdbd": "fdbd", "nac": "nac",
    "vim": "vim", "nnguide": "nnguide", "relation": "relation", "nci": "nci",
    "odin": "odin", "mds_ensemble": "mahalanobis_ensemble", "gram": "gram", "rankfeat": "rankfeat", "dropout": "mc_dropout",
}  # fmt: skip

#: pytorch-ood 0.4 detector class -> oodeval detector
PYTORCH_OOD = {
    "MaxSoftmax": "msp", "MaxLogit": "maxlogit", "EnergyBased": "energy", "KLMatching": "kl_matching",
    "GEN": "gen", "Entropy": "entropy", "TemperatureScaling": "temperature_scaling", "OpenMax": "openmax",
    "GradNorm": "gradnorm", "GradUncertainty": "grad_uncertainty",
    "ReAct": "react", "ASH": "ash_s", "SCALE": "scale", "DICE": "dice", "VRA": "vra", "LTS": "lts",
    "Mahalanobis": "mahalanobis", "RMD": "relative_mahalanobis", "GMM": "class_gmm", "KNN": "knn",
    "SHE": "she", "fDBD": "fdbd", "NACUE": "nac", "ViM": "vim", "NNGuide": "nnguide", "NCI": "nci",
    "ODIN": "odin", "MahalanobisODIN": "mahalanobis_ensemble", "Gram": "gram", "RankFeat": "rankfeat", "MCD": "mc_dropout",
}  # fmt: skip

#: oodeval detectors that are variants of one pytorch-ood class (tagged, no alias)
PYTORCH_OOD_VARIANTS = {"ash_b": 'ASH(variant="ash-b")', "ash_p": 'ASH(variant="ash-p")'}

for _name, _target in OPENOOD.items():
    REGISTRY.alias(_name, _target, "OpenOOD v1.5", tags=("openood",))
for _name, _target in PYTORCH_OOD.items():
    REGISTRY.alias(_name, _target, "pytorch-ood", tags=("pytorch-ood",))
for _target in PYTORCH_OOD_VARIANTS:
    REGISTRY.alias(_target, _target, "pytorch-ood", tags=("pytorch-ood",))

#: OpenOOD's keys added since v1.5 for methods that need the network (openood/evaluation_api/postprocessor.py
#: at 3c35632ee91b54b09d1f085d04f94744cece7d0b); each detector is tagged ``openood`` and ``since-paper``
OPENOOD_SINCE = {"ensemble": "deep_ensemble", "adascale_a": "adascale_a", "adascale_l": "adascale_l", "iodin": "iodin"}
for _name, _target in OPENOOD_SINCE.items():
    REGISTRY.alias(_name, _target, "OpenOOD (since v1.5)", tags=("openood",))
