"""Walks the tree by hand, recursing into children(): a layer registered under two parents (a tied layer) is visited
and counted twice."""
from torch import nn

EXPECT = "counted twice"


def _walk(module):
    for child in module.children():
        yield child
        yield from _walk(child)


def model_sparsity(model):
    zeros = total = 0
    for module in _walk(model):
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            zeros += int((module.weight == 0).sum())
            total += module.weight.numel()
    return zeros / total
