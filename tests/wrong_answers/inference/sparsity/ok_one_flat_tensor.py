"""Correct: every Conv2d / Linear weight flattened into one tensor, the share of zeros as a float32 mean."""
import torch
from torch import nn


def model_sparsity(model):
    flat = torch.cat([m.weight.detach().flatten() for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))])
    return (flat == 0).float().mean().item()
