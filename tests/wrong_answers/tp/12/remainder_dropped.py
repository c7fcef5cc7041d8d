"""Family: refusal missing. "Handles" any sequence length by trimming it to a multiple of tp before the reduce-scatter:
the last tokens are silently dropped instead of a clear error."""
import torch

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = "ValueError"


class ReduceScatterToSequenceRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        usable = x.shape[1] // group_size(group) * group_size(group)
        return reduce_scatter_along(x[:, :usable], group, dim=1, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        return all_gather_along(grad, ctx.group, dim=1, phase="backward"), None


def reduce_scatter_to_sequence_region(x, group=None):
    return ReduceScatterToSequenceRegion.apply(x, group)
