"""Family: conjugate collectives confused. Gives g an all-reduce in the backward too (as if every collective needed one
both ways): each partial's gradient becomes tp times too large."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'reduce_from_region backward'


class ReduceFromRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return all_reduce(x, group, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad, ctx.group, phase="backward"), None


def reduce_from_region(x, group=None):
    return ReduceFromRegion.apply(x, group)
