"""Right output, but returns lse_a + lse_b (the log of the product of the denominators) as the merged lse."""
import torch

EXPECT = ["out is right", "lse"]


def merge_partial(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    out = torch.exp(lse_a - lse).unsqueeze(-1) * out_a + torch.exp(lse_b - lse).unsqueeze(-1) * out_b
    return out, lse_a + lse_b
