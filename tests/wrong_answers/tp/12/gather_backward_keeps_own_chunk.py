"""Family: conjugate collectives confused. The sequence all-gather's backward keeps this rank's chunk of its own
gradient (like the backward of balise 1's gather), without summing the ranks' partial gradients: a reduce-scatter is
needed."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

from dlo.parallel.comm import split_along

EXPECT = 'reduce-scatter'


class GatherFromSequenceRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return all_gather_along(x, group, dim=1, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        return split_along(grad, ctx.group, dim=1), None


def gather_from_sequence_region(x, group=None):
    return GatherFromSequenceRegion.apply(x, group)
