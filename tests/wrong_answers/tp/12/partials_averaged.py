"""Family: sum or mean. Averages the partial outputs (divides the reduce-scatter by tp, as when averaging gradients)
instead of summing them."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'summed, not averaged'


class ReduceScatterToSequenceRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return reduce_scatter_along(x, group, dim=1, phase="forward") / group_size(group)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_along(grad, ctx.group, dim=1, phase="backward") / group_size(ctx.group), None


def reduce_scatter_to_sequence_region(x, group=None):
    return ReduceScatterToSequenceRegion.apply(x, group)
