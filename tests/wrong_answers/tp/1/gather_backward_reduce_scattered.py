"""Family: conjugate collectives confused. Gives the all-gather a reduce-scatter backward (sum the ranks' gradients,
keep this rank's slice), as in sequence parallelism: here every rank already holds the whole gradient, so the slice
comes out tp times too large."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'no sum'


class GatherFromRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return all_gather_last_dim(x, group, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        return split_last_dim(all_reduce(grad, ctx.group, phase="backward"), ctx.group), None


def gather_from_region(x, group=None):
    return GatherFromRegion.apply(x, group)
