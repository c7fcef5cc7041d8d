"""Family: a message that must diagnose. Only the reduce-scatter's backward is the wrong collective (it reduce-
scatters again, as its forward does): the gradient has the wrong shape; the checker names the swapped backward."""
import torch

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = ["reduce_scatter_to_sequence_region backward", "swapped"]


class ReduceScatterToSequenceRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return reduce_scatter_along(x, group, dim=1, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_along(grad, ctx.group, dim=1, phase="backward"), None


def reduce_scatter_to_sequence_region(x, group=None):
    return ReduceScatterToSequenceRegion.apply(x, group)
