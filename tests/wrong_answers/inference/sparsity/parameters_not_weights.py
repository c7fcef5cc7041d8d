"""Counts zeros over model.parameters(): biases and BatchNorm weights, and the pruning's weight_orig instead of the masked weight."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "not biases"


def model_sparsity(model):
    params = list(model.parameters())
    return sum(int((p == 0).sum()) for p in params) / sum(p.numel() for p in params)
