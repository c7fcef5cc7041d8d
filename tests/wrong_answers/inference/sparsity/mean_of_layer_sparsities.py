"""Averages the layers' sparsities: a small layer weighs as much as a big one."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "mean of the per-layer fractions"


def model_sparsity(model):
    layers = [m.weight for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    return sum(float((w == 0).float().mean()) for w in layers) / len(layers)
