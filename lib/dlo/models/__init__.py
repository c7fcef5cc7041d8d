"""Layer 3, models: the CIFAR ResNets, the small nets the lessons use, and a Llama-style decoder with its
configurations.
"""
from __future__ import annotations

from .small import ConditionalHeadsNet, stochastic_depth, StochasticDepthNet, TinyMLP, SmallCNN, MLP

__all__ = [
    "CifarResNet18",
    "resnet18_cifar",
    "count_parameters",
    "ConvBNReLU",
    "Residual",
    "Scale",
    "resnet9",
    "load_pretrained",
    "ConditionalHeadsNet",
    "stochastic_depth",
    "StochasticDepthNet",
    "TinyMLP",
    "SmallCNN",
    "MLP",
]

#: The ResNets load on first use: they build on torchvision, whose import (torch._dynamo with it) costs about 3 s,
#: which every process of a multi-process Llama run or checker would pay for nothing.
_RESNETS = ("CifarResNet18", "resnet18_cifar", "count_parameters", "ConvBNReLU", "Residual", "Scale", "resnet9",
            "load_pretrained")


def __getattr__(name: str):
    if name in _RESNETS:
        from . import resnets

        return getattr(resnets, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
