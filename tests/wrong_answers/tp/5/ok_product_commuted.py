"""Correct, written another way: the product of the two branches written the other way round, f applied once at
the top of forward, the layers built in another order."""
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is written another way
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})


class ParallelSwiGLU(nn.Module):
    def __init__(self, full, group=None):
        super().__init__()
        self.group = group
        self.down_proj = RowParallelLinear(full.down_proj, group)
        self.up_proj = ColumnParallelLinear(full.up_proj, group, copy_input=False)
        self.gate_proj = ColumnParallelLinear(full.gate_proj, group, copy_input=False)

    def forward(self, x):
        x = copy_to_region(x, self.group)
        up = self.up_proj(x)
        return self.down_proj(up * F.silu(self.gate_proj(x)))
