"""Family: parameters not owned. Keeps views of the full layer's weight columns and bias: the parallel layer shares
(and would update) the full one's memory, and a column slice is not even contiguous."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'clone the'


class RowParallelLinear(nn.Module):
    def __init__(self, full, group=None):
        super().__init__()
        self.group = group
        tp, r = group_size(group), group_rank(group)
        _divisible("in_features", full.in_features, tp, "RowParallelLinear")
        n = full.in_features // tp
        self.weight = nn.Parameter(full.weight.detach()[:, r * n:(r + 1) * n])
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach())

    def forward(self, x):
        y = reduce_from_region(F.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias
