"""Multiplies [..., seq] weights with [..., seq, head_dim] outputs without unsqueeze: when seq == head_dim it
silently scales the head dimension instead of the queries."""
import torch

EXPECT = ["wrong axis", "lse[..., None]"]


def merge_partial(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    out = torch.exp(lse_a - lse) * out_a + torch.exp(lse_b - lse) * out_b
    return out, lse
