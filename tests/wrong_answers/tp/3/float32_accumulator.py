"""Family: numerics. Sums the partial product into a buffer made with torch.zeros (no dtype=, so float32): the
numbers are right in float32, but a float64 (or bfloat16) layer returns float32."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = "float32's precision"

_Reference = RowParallelLinear


class RowParallelLinear(_Reference):
    def forward(self, x):
        out = torch.zeros(*x.shape[:-1], self.weight.shape[0])
        out += F.linear(x, self.weight)
        out = reduce_from_region(out, self.group)
        return out if self.bias is None else out + self.bias
