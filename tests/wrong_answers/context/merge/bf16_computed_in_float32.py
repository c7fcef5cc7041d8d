"""Computes in float32 when the inputs are bf16 (for accuracy) and forgets to cast back: the next merge and the
attention's output get float32 tensors. Family: inputs that never reach the mistake (no bf16 input tried)."""
import torch

EXPECT = ["keep the inputs' dtype", "bfloat16"]


def merge_partial(out_a, lse_a, out_b, lse_b):
    if out_a.dtype == torch.bfloat16:
        out_a, lse_a, out_b, lse_b = (t.float() for t in (out_a, lse_a, out_b, lse_b))
    lse = torch.logaddexp(lse_a, lse_b)
    return torch.exp(lse_a - lse).unsqueeze(-1) * out_a + torch.exp(lse_b - lse).unsqueeze(-1) * out_b, lse
