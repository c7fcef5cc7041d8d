"""Family: wrong group. Calls the collectives without the group: they run over every process (the WORLD), not over the
TP group."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'TP group'


class CopyToRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad, phase="backward"), None


class ReduceFromRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return all_reduce(x, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class GatherFromRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return all_gather_last_dim(x, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        return split_last_dim(grad), None


class ScatterToRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return split_last_dim(x)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_last_dim(grad, phase="backward"), None


def copy_to_region(x, group=None):
    return CopyToRegion.apply(x, group)


def reduce_from_region(x, group=None):
    return ReduceFromRegion.apply(x, group)


def gather_from_region(x, group=None):
    return GatherFromRegion.apply(x, group)


def scatter_to_region(x, group=None):
    return ScatterToRegion.apply(x, group)
