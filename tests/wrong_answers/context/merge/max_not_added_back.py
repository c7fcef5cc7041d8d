"""Shifts by the max for stability, weights the outputs right, but returns log(exp(lse_a - m) + exp(lse_b - m))
without adding m back."""
import torch

EXPECT = "max you subtracted"


def merge_partial(out_a, lse_a, out_b, lse_b):
    m = torch.maximum(lse_a, lse_b)
    ea, eb = torch.exp(lse_a - m), torch.exp(lse_b - m)
    out = (ea.unsqueeze(-1) * out_a + eb.unsqueeze(-1) * out_b) / (ea + eb).unsqueeze(-1)
    return out, torch.log(ea + eb)
