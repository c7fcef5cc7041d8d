"""A correct alternative: shift both lse by their max, mix the outputs with the shifted exponentials and divide by
their sum; an empty side has weight exp(-inf) = 0."""
import torch


def merge_partial(out_a, lse_a, out_b, lse_b):
    m = torch.maximum(lse_a, lse_b)
    ea, eb = torch.exp(lse_a - m), torch.exp(lse_b - m)
    total = ea + eb
    out = (ea[..., None] * out_a + eb[..., None] * out_b) / total[..., None]
    return out, m + torch.log(total)
