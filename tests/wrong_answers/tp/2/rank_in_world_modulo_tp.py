"""Family: wrong group. Takes the rank among all processes, modulo tp, for the rank inside the TP group: the same
when the TP groups are contiguous blocks, wrong as soon as a group is strided (ranks {0, 2} of a TP x DP layout, where
process 2 is rank 1 of its group)."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = "group_rank(group)"


class ColumnParallelLinear(nn.Module):
    def __init__(self, full, group=None, *, gather_output=False, copy_input=True):
        super().__init__()
        self.group, self.gather_output, self.copy_input = group, gather_output, copy_input
        tp = group_size(group)
        r = dist.get_rank() % tp if dist.is_initialized() else 0
        _divisible("out_features", full.out_features, tp, "ColumnParallelLinear")
        n = full.out_features // tp
        self.weight = nn.Parameter(full.weight.detach()[r * n:(r + 1) * n].clone())
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach()[r * n:(r + 1) * n].clone())

    def forward(self, x):
        if self.copy_input:
            x = copy_to_region(x, self.group)
        y = F.linear(x, self.weight, self.bias)
        return gather_from_region(y, self.group) if self.gather_output else y
