"""Family: right numbers, wrong traffic. Keeps the all-reduce of plain TP and slices this rank's tokens after it: the
numbers are right, but it moves the whole tensor to every rank (twice the bytes of a reduce-scatter) and holds it
whole, the memory SP is meant to save."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

from dlo.parallel.comm import split_along

EXPECT = 'all-reduce'


class ReduceScatterToSequenceRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return split_along(all_reduce(x, group, phase="forward"), group, dim=1)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_along(grad, ctx.group, dim=1, phase="backward"), None


def reduce_scatter_to_sequence_region(x, group=None):
    return ReduceScatterToSequenceRegion.apply(x, group)
