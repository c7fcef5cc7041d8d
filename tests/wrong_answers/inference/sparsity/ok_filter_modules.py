"""Correct: the weights of the linear and convolution layers collected by a filter, the zeros counted as a share of
them in float."""
from torch import nn


def model_sparsity(model):
    weights = [m.weight for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    zeros = sum(float((w == 0).sum()) for w in weights)
    return zeros / sum(w.numel() for w in weights)
