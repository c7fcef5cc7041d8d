"""Averages the weight matrices only; the 1-D tensors (biases, BatchNorm running statistics) are copied from the model."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = ["not averaged", "bn.running_mean"]


def ema_update(ema_params, params, decay):
    # biases and normalisation statistics are "not really weights": take them as they are
    return [decay * e + (1 - decay) * p.detach() if p.dim() > 1 else p.detach().clone()
            for e, p in zip(ema_params, params)]
