"""Returns a percentage (0-100) where the contract asks for a fraction of the weights."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "percentage"


def model_sparsity(model):
    zeros = total = 0
    for module in model.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            zeros += int((module.weight == 0).sum())
            total += module.weight.numel()
    return 100.0 * zeros / total
