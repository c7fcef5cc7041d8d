"""A correct alternative: the larger lse plus log1p of the smaller one's exponential relative to it, written with
-|lse_a - lse_b| so that the exponential never exceeds 1 (an empty side gives exp(-inf) = 0)."""
import torch


def merge_partial(out_a, lse_a, out_b, lse_b):
    lse = torch.maximum(lse_a, lse_b) + torch.log1p(torch.exp(-(lse_a - lse_b).abs()))
    out = torch.exp(lse_a - lse).unsqueeze(-1) * out_a + torch.exp(lse_b - lse).unsqueeze(-1) * out_b
    return out, lse
