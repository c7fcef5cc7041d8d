"""Family: wrong group. Calls reduce_from_region without the group: the partial outputs are summed over every process,
not over the TP group."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'every rank'


class RowParallelLinear(nn.Module):
    def __init__(self, full, group=None):
        super().__init__()
        self.group = group
        tp, r = group_size(group), group_rank(group)
        _divisible("in_features", full.in_features, tp, "RowParallelLinear")
        n = full.in_features // tp
        self.weight = nn.Parameter(full.weight.detach()[:, r * n:(r + 1) * n].clone())
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach().clone())

    def forward(self, x):
        y = reduce_from_region(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias
