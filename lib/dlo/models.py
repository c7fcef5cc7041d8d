"""Models used across the workbook.

CIFAR-10 images are 32x32. torchvision's ResNet-18 is built for 224x224 ImageNet images: its 7x7 stride-2
stem followed by a max-pool shrinks a 32x32 image to 8x8 before the first residual block, which wastes
most of the network. The usual CIFAR adaptation (used here) replaces the stem by a 3x3 stride-1
convolution and drops the max-pool.

``width`` scales every layer's channel count (64 for the real ResNet-18) so that CPU smoke runs can use a
tiny network with the very same architecture.
"""
from __future__ import annotations

import torch
from torch import nn

import dlo  # noqa: F401  (torchvision shim)
from torchvision.models.resnet import BasicBlock, ResNet


class CifarResNet18(ResNet):
    """torchvision's ResNet with BasicBlocks [2, 2, 2, 2], a 3x3 stride-1 stem and no max-pool.

    Reuses torchvision's ``BasicBlock`` and ``ResNet._make_layer``; only the stem and the channel
    widths differ (``width`` channels in the first stage, doubled at each of the next three).
    """

    def __init__(self, num_classes: int = 10, width: int = 64) -> None:
        nn.Module.__init__(self)
        self._norm_layer = nn.BatchNorm2d
        self.inplanes, self.dilation, self.groups, self.base_width = width, 1, 1, 64
        self.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.Identity()
        self.layer1 = self._make_layer(BasicBlock, width, 2)
        self.layer2 = self._make_layer(BasicBlock, width * 2, 2, stride=2)
        self.layer3 = self._make_layer(BasicBlock, width * 4, 2, stride=2)
        self.layer4 = self._make_layer(BasicBlock, width * 8, 2, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 8, num_classes)
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)


def resnet18_cifar(num_classes: int = 10, width: int = 64) -> nn.Module:
    """ResNet-18 for 32x32 inputs. ``width=64`` is the standard network (11.2 M parameters)."""
    if not isinstance(width, int) or isinstance(width, bool) or width < 1:
        raise ValueError(f"width must be a positive integer (64 is the standard ResNet-18), got {width!r}")
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive integer, got {num_classes!r}")
    return CifarResNet18(num_classes=num_classes, width=width)


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


class ConvBNReLU(nn.Sequential):
    """conv -> BN -> ReLU. ``bias`` defaults to False: BatchNorm subtracts the mean right after the
    convolution, so a convolution bias is cancelled out and only costs memory and time."""

    def __init__(self, c_in: int, c_out: int, bias: bool = False) -> None:
        super().__init__(nn.Conv2d(c_in, c_out, 3, padding=1, bias=bias), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))
