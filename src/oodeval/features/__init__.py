"""Feature store: the FeatureSet container (extraction lives in submodules that import torch)."""

from .featureset import FIELDS, FeatureSet

__all__ = ["FeatureSet", "FIELDS"]
