"""Copies the current weights: no averaging at all."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "equals the current weights"


def ema_update(ema_params, params, decay):
    return [p.detach().clone() for p in params]
