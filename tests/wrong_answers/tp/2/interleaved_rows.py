"""Family: wrong shard. Takes every tp-th row (r, r + tp, ...) instead of the contiguous block of rows r*n:(r+1)*n: the
output features land on the wrong ranks."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'which rows'


class ColumnParallelLinear(nn.Module):
    def __init__(self, full, group=None, *, gather_output=False, copy_input=True):
        super().__init__()
        self.group, self.gather_output, self.copy_input = group, gather_output, copy_input
        tp, r = group_size(group), group_rank(group)
        _divisible("out_features", full.out_features, tp, "ColumnParallelLinear")
        n = full.out_features // tp
        self.weight = nn.Parameter(full.weight.detach()[r::tp].clone())
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach()[r::tp].clone())

    def forward(self, x):
        if self.copy_input:
            x = copy_to_region(x, self.group)
        y = F.linear(x, self.weight, self.bias)
        return gather_from_region(y, self.group) if self.gather_output else y
