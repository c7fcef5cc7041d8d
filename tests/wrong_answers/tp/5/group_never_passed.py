"""Family: wrong group. Builds the parallel layers and f without the group: everything is split and summed over every
process (tp = 4 instead of the TP group's 2), which gives the right numbers here but is not tensor parallelism over
the given group (beside a DP dimension, it would mix the replicas)."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'not over every rank'


class ParallelSwiGLU(nn.Module):
    def __init__(self, full, group=None):
        super().__init__()
        self.group = group
        _divisible("intermediate_size", full.gate_proj.out_features, group_size(group), "ParallelSwiGLU")
        self.gate_proj = ColumnParallelLinear(full.gate_proj, copy_input=False)
        self.up_proj = ColumnParallelLinear(full.up_proj, copy_input=False)
        self.down_proj = RowParallelLinear(full.down_proj)

    def forward(self, x):
        x = copy_to_region(x)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
