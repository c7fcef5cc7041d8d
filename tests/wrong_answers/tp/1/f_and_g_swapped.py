"""Family: conjugate collectives confused. Swaps f and g: copy_to_region all-reduces in the forward (identity backward)
and reduce_from_region is the identity forward (all-reduce backward)."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'identity'


class CopyToRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return all_reduce(x, group, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class ReduceFromRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad, ctx.group, phase="backward"), None


def copy_to_region(x, group=None):
    return CopyToRegion.apply(x, group)


def reduce_from_region(x, group=None):
    return ReduceFromRegion.apply(x, group)
