"""Named evaluation suites: ID dataset + OOD sets, grouped.

- ``cnc-cifar10`` / ``cnc-cifar100``: the CnC paper's CIFAR suite (Hebbalaguppe et al. 2022,
  Tab. 1-2, following ODIN / Liang et al. 2018): ID CIFAR-10 or CIFAR-100 (test split) against
  SVHN, TinyImageNet crop / resize, LSUN crop / resize and iSUN; metrics are averaged over the six
  OOD sets (one group, ``ood``).
- ``openood-cifar10`` / ``openood-cifar100``: OpenOOD v1.5's split (Zhang et al. 2023,
  arXiv:2306.09301; configs ``cifar10_ood.yml``): near-OOD = the other CIFAR and TinyImageNet;
  far-OOD = MNIST, SVHN, Textures, Places365. Averaged per group. Note: OpenOOD's own
  FPR@95 is a different quantity (docs/conventions.md); here its *sets* are used with our metrics.
- ``demo-fmnist``: the offline demo benchmark (:mod:`oodeval.demo.data`): six Fashion-MNIST
  classes as ID against the four held-out classes (near) and digits, photos, noise (far).

Names are resolved by :func:`oodeval.data.resolve`: registry names (``NAME:SPLIT`` picks a
split) or user datasets ``<data_root>/NAME/manifest.csv``. OpenOOD's ``mnist``, ``tin``,
``texture`` and ``places365`` (its own CIFAR-scale versions, overlaps with CIFAR removed) are
not in the registry and are read as user datasets. This module only names what belongs together.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UnknownNameError

__all__ = ["Suite", "SUITES", "suite", "ood_sets"]


@dataclass(frozen=True)
class Suite:
    """An ID dataset (train and test split names) and its OOD sets by group."""

    name: str
    id_train: str
    id_test: str
    groups: dict[str, tuple[str, ...]]
    source: str

    @property
    def ood(self) -> tuple[str, ...]:
        """Every OOD set once, in group order."""
        out: list[str] = []
        for sets in self.groups.values():
            out += [s for s in sets if s not in out]
        return tuple(out)


_CNC = ("svhn:test", "tin-crop", "tin-resize", "lsun-crop", "lsun-resize", "isun")
_FAR = ("mnist", "svhn:test", "texture", "places365")

SUITES: dict[str, Suite] = {
    s.name: s
    for s in (
        Suite("cnc-cifar10", "cifar10:train", "cifar10:test", {"ood": _CNC}, "CnC paper Tab. 1 (ODIN suite)"),
        Suite("cnc-cifar100", "cifar100:train", "cifar100:test", {"ood": _CNC}, "CnC paper Tab. 2 (ODIN suite)"),
        Suite(
            "openood-cifar10", "cifar10:train", "cifar10:test",
            {"near": ("cifar100:test", "tin"), "far": _FAR}, "OpenOOD v1.5 cifar10_ood.yml",
        ),
        Suite(
            "openood-cifar100", "cifar100:train", "cifar100:test",
            {"near": ("cifar10:test", "tin"), "far": _FAR}, "OpenOOD v1.5 cifar100_ood.yml",
        ),
        Suite(
            "demo-fmnist", "demo-fmnist6-train", "demo-fmnist6-test",
            {"near": ("demo-fmnist-heldout",),
             "far": ("demo-digits", "demo-photos", "demo-noise-uniform", "demo-noise-gaussian")},
            "oodeval demo benchmark (oodeval.demo.data)",
        ),
    )
}  # fmt: skip


def suite(name: str) -> Suite:
    """The suite called ``name`` (KeyError listing the known ones)."""
    if name not in SUITES:
        raise UnknownNameError(f"unknown suite {name!r}; known: {', '.join(SUITES)}")
    return SUITES[name]


def ood_sets(name: str) -> tuple[str, ...]:
    """The OOD set names of suite ``name``."""
    return suite(name).ood
