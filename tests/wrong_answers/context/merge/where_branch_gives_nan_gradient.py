"""The larger lse plus log1p of the smaller one's exponential relative to it, chosen per query with torch.where:
the values are right (where discards the branch not taken, even when it overflows), but the gradient of that branch
is still computed, and 0 * inf gives NaN at large scores. Family: values checked, gradients not."""
import torch

EXPECT = ["gradient", "NaN", "torch.where"]


def merge_partial(out_a, lse_a, out_b, lse_b):
    lse = torch.where(lse_a >= lse_b, lse_a + torch.log1p(torch.exp(lse_b - lse_a)),
                      lse_b + torch.log1p(torch.exp(lse_a - lse_b)))
    out = torch.exp(lse_a - lse).unsqueeze(-1) * out_a + torch.exp(lse_b - lse).unsqueeze(-1) * out_b
    return out, lse
