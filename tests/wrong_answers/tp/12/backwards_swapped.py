"""Family: a message that must diagnose. The two regions' backwards are swapped (the gather's backward gathers, the
reduce-scatter's backward reduce-scatters): autograd then refuses a gradient of the wrong shape, and the checker must
say which region and why instead of showing autograd's shape error."""
import torch

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = ["gather_from_sequence_region backward", "swapped"]


class GatherFromSequenceRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return all_gather_along(x, group, dim=1, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        return all_gather_along(grad, ctx.group, dim=1, phase="backward"), None


class ReduceScatterToSequenceRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return reduce_scatter_along(x, group, dim=1, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_along(grad, ctx.group, dim=1, phase="backward"), None


def gather_from_sequence_region(x, group=None):
    return GatherFromSequenceRegion.apply(x, group)


def reduce_scatter_to_sequence_region(x, group=None):
    return ReduceScatterToSequenceRegion.apply(x, group)
