"""Correct, written another way: the partial product with a matmul, the bias added after the sum, the columns
taken with narrow."""
import torch
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is written another way
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})


class RowParallelLinear(nn.Module):
    def __init__(self, full, group=None):
        super().__init__()
        self.group = group
        tp, r = group_size(group), group_rank(group)
        n = full.in_features // tp
        self.weight = nn.Parameter(full.weight.detach().narrow(1, r * n, n).clone())
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach().clone())

    def forward(self, x):
        total = reduce_from_region(torch.matmul(x, self.weight.t()), self.group)
        if self.bias is not None:
            total = total + self.bias
        return total
