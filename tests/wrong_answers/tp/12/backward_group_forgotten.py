"""Family: wrong group. The sequence all-gather's backward forgets the group (ctx.group never used): its reduce-scatter
runs over every process instead of the TP group."""
import torch

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = "pass the group"


class GatherFromSequenceRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return all_gather_along(x, group, dim=1, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_along(grad, dim=1, phase="backward"), None


def gather_from_sequence_region(x, group=None):
    return GatherFromSequenceRegion.apply(x, group)
