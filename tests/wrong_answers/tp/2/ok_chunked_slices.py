"""Correct, written another way: the rows are taken with torch.chunk, and the output gathered through the
gather_from_region primitive only when asked."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is written another way
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})


class ColumnParallelLinear(nn.Module):
    def __init__(self, full, group=None, *, gather_output=False, copy_input=True):
        super().__init__()
        self.group, self.gather_output, self.copy_input = group, gather_output, copy_input
        tp, r = group_size(group), group_rank(group)
        self.weight = nn.Parameter(full.weight.detach().chunk(tp, dim=0)[r].clone())
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach().chunk(tp)[r].clone())

    def forward(self, x):
        inp = copy_to_region(x, self.group) if self.copy_input else x
        out = inp @ self.weight.t()
        if self.bias is not None:
            out = out + self.bias
        if not self.gather_output:
            return out
        return gather_from_region(out, self.group)
