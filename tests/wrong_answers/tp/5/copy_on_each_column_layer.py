"""Family: right numbers, wrong traffic. Leaves copy_input=True on gate and up: the input's gradient is all-reduced
twice in the backward."""
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
        self.gate_proj = ColumnParallelLinear(full.gate_proj, group)
        self.up_proj = ColumnParallelLinear(full.up_proj, group)
        self.down_proj = RowParallelLinear(full.down_proj, group)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
