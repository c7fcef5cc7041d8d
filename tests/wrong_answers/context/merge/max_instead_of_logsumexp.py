"""Takes the larger lse as the merged lse (the max, not the log-sum-exp), and weights the outputs relative to it."""
import torch

EXPECT = ["max", "log-sum-exp"]


def merge_partial(out_a, lse_a, out_b, lse_b):
    lse = torch.maximum(lse_a, lse_b)
    out = torch.exp(lse_a - lse).unsqueeze(-1) * out_a + torch.exp(lse_b - lse).unsqueeze(-1) * out_b
    return out, lse
