"""OpenOOD's own networks (``openood:resnet18_32x32``, ``openood:resnet18_224x224``) with their
state-dict layouts and OpenOOD's test transforms.

``resnet18_32x32``: OpenOOD v1.5's CIFAR ``ResNet18_32x32`` (``openood/networks/resnet18_32x32.py``):
a 3x3 stride-1 stem conv (no bias) + BN + ReLU, no max-pool, four stages of two BasicBlocks
(64, 128, 256, 512 channels; stride 1, 2, 2, 2; a 1x1 conv + BN ``shortcut`` where the shape
changes), adaptive average pooling to 1x1 and a Linear ``fc``. ``resnet18_224x224``: its
ImageNet-200 network (``openood/networks/resnet18_224x224.py``), torchvision's ResNet-18 (7x7
stride-2 stem, max-pool, ``downsample`` shortcuts) under torchvision's module names. Module names
are the release's, so its checkpoints (``torch.save(net.state_dict(), "best.ckpt")``, e.g.
``cifar10_resnet18_32x32_base_e100_lr0.1_default/s0/best.ckpt``) load with strict key matching.
Read by extraction as any module (:mod:`oodeval.features.module`): features = the 512-d pooled
output (``fc``'s input), logits = ``fc``.

Preprocessing is the release's test transform (``openood/evaluation_api/preprocessor.py``,
``default_preprocessing_dict``): resize to ``pre_size`` (bilinear), centre crop ``img_size``, to
tensor, normalise with the benchmark's mean/std (:data:`PREPROCESSING`); the image reaches it in
RGB (extraction converts to the backbone's ``image_mode``, as the release's ``Convert('RGB')``).
``model_kwargs``: ``benchmark`` (the preprocessing and the default number of classes; default
cifar10 for the 32x32 network, imagenet200 for the 224x224 one) and ``num_classes``. OpenOOD
publishes no hub weights: give a checkpoint file.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from .._extras import optional
from ..errors import InputError, UnknownNameError

__all__ = ["ARCHITECTURES", "PREPROCESSING", "BasicBlock", "ResNet18_32x32", "resnet18_224x224", "openood_transform", "load_openood"]

#: per benchmark the release's (pre_size, img_size, mean, std) and the benchmark's class count
PREPROCESSING = {
    "cifar10": (32, 32, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": (32, 32, (0.5071, 0.4867, 0.4408), (0.2675, 0.2565, 0.2761)),
    "imagenet200": (256, 224, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "imagenet": (256, 224, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
}
_CLASSES = {"cifar10": 10, "cifar100": 100, "imagenet200": 200, "imagenet": 1000}


class BasicBlock(nn.Module):
    """Two 3x3 convs with BN; identity shortcut, or 1x1 conv + BN where stride or width changes."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, kernel_size=1, stride=stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18_32x32(nn.Module):
    """OpenOOD's CIFAR ResNet-18: ``forward(x)`` gives the logits; ``fc``'s input is the 512-d feature."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.in_planes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.layer1 = self._make_layer(64, stride=1)
        self.layer2 = self._make_layer(128, stride=2)
        self.layer3 = self._make_layer(256, stride=2)
        self.layer4 = self._make_layer(512, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)
        self.feature_size = 512

    def _make_layer(self, planes: int, stride: int, blocks: int = 2) -> nn.Sequential:
        layers = []
        for s in [stride] + [1] * (blocks - 1):
            layers.append(BasicBlock(self.in_planes, planes, s))
            self.in_planes = planes
        return nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        return self.fc(self.avgpool(out).flatten(1))


def resnet18_224x224(num_classes: int = 200) -> nn.Module:
    """OpenOOD's ``ResNet18_224x224``: torchvision's ResNet-18 (BasicBlock, [2, 2, 2, 2]); its forward
    is torchvision's (stem, max-pool, four stages, average pool, flatten, ``fc``)."""
    resnet = optional("torchvision.models.resnet")
    return resnet.ResNet(resnet.BasicBlock, [2, 2, 2, 2], num_classes=num_classes)


#: ``openood:<name>`` -> (network factory, the benchmarks it is OpenOOD's network for, the first the default)
ARCHITECTURES: dict[str, tuple[Callable[..., nn.Module], tuple[str, ...]]] = {
    "resnet18_32x32": (ResNet18_32x32, ("cifar10", "cifar100")),
    "resnet18_224x224": (resnet18_224x224, ("imagenet200", "imagenet")),
}


def openood_transform(benchmark: str) -> Callable:
    """OpenOOD's test transform for ``benchmark`` (an RGB PIL image; see the module doc)."""
    transforms = optional("torchvision.transforms")
    pre, size, mean, std = PREPROCESSING[benchmark]
    return transforms.Compose([
        transforms.Resize(pre, interpolation=transforms.InterpolationMode.BILINEAR),
        transforms.CenterCrop(size),
        transforms.ToTensor(),
        transforms.Normalize(mean, std),
    ])  # fmt: skip


def load_openood(name: str, model_kwargs: dict | None = None, pretrained: bool = False) -> tuple[nn.Module, Callable]:
    """``(network, transform)`` of ``openood:<name>``, randomly initialised (load weights after)."""
    if name not in ARCHITECTURES:
        raise UnknownNameError(f"unknown OpenOOD network {name!r}; known: {', '.join('openood:' + n for n in ARCHITECTURES)}")
    factory, benchmarks = ARCHITECTURES[name]
    if pretrained:
        raise InputError(f"openood:{name} has no hub weights (OpenOOD publishes checkpoints as downloads, e.g. "
                         f"{benchmarks[0]}_{name}_base_.../s0/best.ckpt); give weights = that file, or pretrained = false")
    kwargs = dict(model_kwargs or {})
    unknown = sorted(set(kwargs) - {"benchmark", "num_classes"})
    if unknown:
        raise InputError(f"openood:{name} takes model_kwargs benchmark and num_classes, not {', '.join(unknown)}")
    benchmark = kwargs.get("benchmark", benchmarks[0])
    if benchmark not in benchmarks:
        raise InputError(f"openood:{name}: benchmark must be one of {', '.join(benchmarks)} (its preprocessing), got {benchmark!r}")
    num_classes = kwargs.get("num_classes", _CLASSES[benchmark])
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 1:
        raise InputError(f"openood:{name}: num_classes must be a positive integer, got {num_classes!r}")
    return factory(num_classes=num_classes).eval(), openood_transform(benchmark)
