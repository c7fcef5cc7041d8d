"""Writes the merged lse as lse_b plus the softplus of the difference: exact and safe at large scores, but when part
b is empty (lse_b = -inf) it adds -inf and +inf: NaN. Family: only one side of the merge ever fully masked."""
import torch
import torch.nn.functional as F

EXPECT = ["part b is empty", "-inf"]


def merge_partial(out_a, lse_a, out_b, lse_b):
    lse = lse_b + F.softplus(lse_a - lse_b)
    out = torch.exp(lse_a - lse).unsqueeze(-1) * out_a + torch.exp(lse_b - lse).unsqueeze(-1) * out_b
    return out, lse
