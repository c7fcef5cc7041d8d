"""Family: a piece left out. Uses f (copy_to_region) where g belongs: the forward never sums the ranks' partial
outputs."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'partial sum'


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
        y = copy_to_region(F.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias
