"""Family: right numbers, wrong traffic. Counts the backward collectives under phase "forward" (copied from the
forward): the numbers are right, the per-phase count of the step is not."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = "phase='backward'"


class GatherFromSequenceRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return all_gather_along(x, group, dim=1, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_along(grad, ctx.group, dim=1, phase="forward"), None


def gather_from_sequence_region(x, group=None):
    return GatherFromSequenceRegion.apply(x, group)
