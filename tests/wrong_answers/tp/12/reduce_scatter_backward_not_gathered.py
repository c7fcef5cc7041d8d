"""Family: conjugate collectives confused. The reduce-scatter's backward passes the gradient of this rank's tokens
through unchanged (as g's backward does): the input covered the whole sequence, so its gradient must be
all-gathered."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'all-gather'


class ReduceScatterToSequenceRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return reduce_scatter_along(x, group, dim=1, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def reduce_scatter_to_sequence_region(x, group=None):
    return ReduceScatterToSequenceRegion.apply(x, group)
