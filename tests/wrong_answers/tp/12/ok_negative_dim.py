"""Correct, written another way: the sequence named by its negative index (dim=-2 of [batch, seq, hidden]) and the
group read back from ctx in a local name."""
import torch

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is written another way
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})


class GatherFromSequenceRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return all_gather_along(x, group, dim=-2, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        group = ctx.group
        return reduce_scatter_along(grad, group, dim=-2, phase="backward"), None


class ReduceScatterToSequenceRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return reduce_scatter_along(x, group, dim=-2, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        group = ctx.group
        return all_gather_along(grad, group, dim=-2, phase="backward"), None


def gather_from_sequence_region(x, group=None):
    return GatherFromSequenceRegion.apply(x, group)


def reduce_scatter_to_sequence_region(x, group=None):
    return ReduceScatterToSequenceRegion.apply(x, group)
