"""Walks named_parameters() for matrices called *weight*: on a pruned layer that is weight_orig, which has no zeros (the mask is applied to module.weight)."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "weight_orig"


def model_sparsity(model):
    zeros = total = 0
    for name, p in model.named_parameters():
        if "weight" in name and p.dim() > 1:  # Conv2d / Linear weights, not biases or BatchNorm
            zeros += int((p == 0).sum())
            total += p.numel()
    return zeros / total
