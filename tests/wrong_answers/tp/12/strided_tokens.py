"""Family: wrong shard. Takes this rank's tokens strided (every tp-th token, from position r) after the sum, while the
all-gather puts contiguous chunks back: the tokens come back in the wrong places."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'contiguous'


class ReduceScatterToSequenceRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        tp, r = group_size(group), group_rank(group)
        return all_reduce(x, group, phase="forward")[:, r::tp].contiguous()

    @staticmethod
    def backward(ctx, grad):
        return all_gather_along(grad, ctx.group, dim=1, phase="backward"), None


def reduce_scatter_to_sequence_region(x, group=None):
    return ReduceScatterToSequenceRegion.apply(x, group)
