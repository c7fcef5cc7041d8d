"""Guards against overflow by exponentiating in float64 (which reaches about 1e308): fine at scores of a few
hundred, but far below zero exp(lse) underflows to 0 even in float64, and 0 / 0 gives NaN. Family: inputs that
never reach the mistake (only large positive scores tried)."""
import torch

EXPECT = ["underflow"]


def merge_partial(out_a, lse_a, out_b, lse_b):
    sa, sb = torch.exp(lse_a.double()), torch.exp(lse_b.double())
    total = sa + sb
    out = (sa.unsqueeze(-1) * out_a.double() + sb.unsqueeze(-1) * out_b.double()) / total.unsqueeze(-1)
    return out.to(out_a.dtype), torch.log(total).to(lse_a.dtype)
