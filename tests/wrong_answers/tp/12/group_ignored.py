"""Family: wrong group. Never passes the group to the collectives: with several TP groups, the all-gather collects
every process's tokens."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'group'


class GatherFromSequenceRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return all_gather_along(x, dim=1, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_along(grad, dim=1, phase="backward"), None


class ReduceScatterToSequenceRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return reduce_scatter_along(x, dim=1, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        return all_gather_along(grad, dim=1, phase="backward"), None


def gather_from_sequence_region(x, group=None):
    return GatherFromSequenceRegion.apply(x, group)


def reduce_scatter_to_sequence_region(x, group=None):
    return ReduceScatterToSequenceRegion.apply(x, group)

