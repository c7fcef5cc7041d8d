"""Layer 3, models: the CIFAR ResNets, the small nets the lessons use, and a Llama-style decoder with its
configurations.
"""
from __future__ import annotations

from .resnets import (
    CifarResNet18, resnet18_cifar, count_parameters, ConvBNReLU, Residual, Scale, resnet9, load_pretrained,
)
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
