"""What the peers' methods (OpenOOD's and pytorch-ood's, docs/detectors.md) share: they run when
named and are left out of the default selection (:func:`oodeval.detectors.supported`), so that
``oodeval score`` / ``oodeval run`` without a detector list keep running the paper's 21 (and cnc)."""

from __future__ import annotations

from ..features import FeatureSet
from .base import Detector

__all__ = ["PeerMethod"]


class PeerMethod(Detector):
    """Base of the peers' methods: opt-in (never picked by default, run when named)."""

    @classmethod
    def suits(cls, x: FeatureSet) -> bool:
        return False
