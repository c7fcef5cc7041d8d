"""Right lse, but the outputs are weighted by exp(lse_part - max), weights that do not sum to 1."""
import torch

EXPECT = "not renormalised"


def merge_partial(out_a, lse_a, out_b, lse_b):
    m = torch.maximum(lse_a, lse_b)
    lse = m + torch.log(torch.exp(lse_a - m) + torch.exp(lse_b - m))
    out = torch.exp(lse_a - m).unsqueeze(-1) * out_a + torch.exp(lse_b - m).unsqueeze(-1) * out_b
    return out, lse
