"""Family: right numbers, wrong traffic. Gathers by writing this rank's slice into zeros of the full width and
all-reducing: the right values, but an all-reduce of the whole tensor where one all-gather belongs."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'all_gather'


class GatherFromRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        n, r = group_size(group), group_rank(group)
        size = x.shape[-1]
        full = x.new_zeros(*x.shape[:-1], size * n)
        full[..., r * size:(r + 1) * size] = x
        return all_reduce(full, group, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        return split_last_dim(grad, ctx.group), None


def gather_from_region(x, group=None):
    return GatherFromRegion.apply(x, group)
