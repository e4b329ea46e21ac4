"""CnC: compounded-corruption outlier exposure (Hebbalaguppe et al. 2022, arXiv:2207.13916).

Submodules (import what you need; nothing heavy is imported here):

- :mod:`~oodeval.cnc.corruptions`: the ImageNet-C family corruptions, ``corrupt(...)``;
- :mod:`~oodeval.cnc.cutmix`: CutMix of two different-class images + one corruption;
- :mod:`~oodeval.cnc.augment`: the release's ID and outlier-source augmentations;
- :mod:`~oodeval.cnc.loader`: whole training steps built in DataLoader workers, seeded per step;
- :mod:`~oodeval.cnc.train`: K+1 training with timm models, the release's recipe, resumable run
  folders, extraction;
- :mod:`~oodeval.cnc.suites`: the CIFAR suite and OpenOOD v1.5's near/far split;
- :mod:`~oodeval.cnc.evaluate`: per-set and mean metrics, mean ± std over seeds;
- :mod:`~oodeval.cnc.datasets`: uint8 arrays from registry names, manifests or ``.npz`` files.

The detector is ``oodeval.detectors.create("cnc")``; the CLI is ``oodeval cnc train|evaluate``.
"""
