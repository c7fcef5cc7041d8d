"""Exponentiates the lse directly: exact in theory, inf in float32 as soon as the scores exceed about 88."""
import torch

EXPECT = ["overflow", "max"]


def merge_partial(out_a, lse_a, out_b, lse_b):
    sa, sb = torch.exp(lse_a), torch.exp(lse_b)
    out = (sa.unsqueeze(-1) * out_a + sb.unsqueeze(-1) * out_b) / (sa + sb).unsqueeze(-1)
    return out, torch.log(sa + sb)
