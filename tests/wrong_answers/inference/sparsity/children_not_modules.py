"""model.children() sees only the top-level layers: a Linear inside a nested Sequential is missed."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "nested"


def model_sparsity(model):
    zeros = total = 0
    for module in model.children():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            zeros += int((module.weight == 0).sum())
            total += module.weight.numel()
    return zeros / total
