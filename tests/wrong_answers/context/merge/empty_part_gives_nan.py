"""Subtracts the merged lse computed by hand without guarding -inf: max(-inf, x) is fine, but this version takes
the min as the shift, so a fully masked part (lse = -inf) gives -inf - (-inf) = NaN."""
import torch

EXPECT = ["empty", "-inf"]


def merge_partial(out_a, lse_a, out_b, lse_b):
    m = torch.minimum(lse_a, lse_b)
    lse = m + torch.log(torch.exp(lse_a - m) + torch.exp(lse_b - m))
    out = torch.exp(lse_a - lse).unsqueeze(-1) * out_a + torch.exp(lse_b - lse).unsqueeze(-1) * out_b
    return out, lse
