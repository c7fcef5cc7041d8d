"""Correct, written another way: f's forward returns a clone instead of a view, and the gather's backward picks this
rank's slice with chunk instead of split_last_dim."""
import torch

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is written another way
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})


class CopyToRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad, ctx.group, phase="backward"), None


class GatherFromRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return all_gather_last_dim(x, group, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        mine = grad.chunk(group_size(ctx.group), dim=-1)[group_rank(ctx.group)]
        return mine.contiguous(), None


def copy_to_region(x, group=None):
    return CopyToRegion.apply(x, group)


def gather_from_region(x, group=None):
    return GatherFromRegion.apply(x, group)
