"""A correct alternative: the two weights are the softmax of the pair (lse_a, lse_b), and the merged lse their
log-sum-exp, both taken along a new last axis."""
import torch


def merge_partial(out_a, lse_a, out_b, lse_b):
    both = torch.stack([lse_a, lse_b], dim=-1)
    w = torch.softmax(both, dim=-1)
    out = w[..., 0:1] * out_a + w[..., 1:2] * out_b
    return out, torch.logsumexp(both, dim=-1)
