"""Family: right numbers, wrong traffic. Gathers gate and up (gather_output=True) and applies a whole copy of down_proj
on every rank: the right numbers, but two all-gathers of the wide intermediate activations and a replicated
down_proj, where one all-reduce of the narrow output belongs."""
import copy

import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'exactly 1 all-reduce'


class ParallelSwiGLU(nn.Module):
    def __init__(self, full, group=None):
        super().__init__()
        self.group = group
        _divisible("intermediate_size", full.gate_proj.out_features, group_size(group), "ParallelSwiGLU")
        self.gate_proj = ColumnParallelLinear(full.gate_proj, group, gather_output=True, copy_input=False)
        self.up_proj = ColumnParallelLinear(full.up_proj, group, gather_output=True, copy_input=False)
        self.down_proj = copy.deepcopy(full.down_proj)

    def forward(self, x):
        x = copy_to_region(x, self.group)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
