"""Family: right numbers, wrong traffic. Builds the sequence all-gather from an all-reduce: each rank writes its tokens
into a zero buffer of the whole sequence and the buffers are summed. The values are right, but the all-reduce moves
twice the bytes of an all-gather, which is the saving SP keeps on the wire."""
import torch

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = ["all-reduce", "all_gather_along"]


class GatherFromSequenceRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        tp, r, s = group_size(group), group_rank(group), x.shape[1]
        buf = x.new_zeros(x.shape[0], s * tp, *x.shape[2:])
        buf[:, r * s:(r + 1) * s] = x
        return all_reduce(buf, group, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_along(grad, ctx.group, dim=1, phase="backward"), None


def gather_from_sequence_region(x, group=None):
    return GatherFromSequenceRegion.apply(x, group)
