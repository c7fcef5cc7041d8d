"""Renormalises the weights over the kept choices only, after the capacity: a token whose second choice was dropped
then sends its whole weight to the first. Family: two steps in the wrong order."""
import torch
import torch.nn.functional as F

EXPECT = ["renormalised again", "kept"]


def route_tokens(probs, top_k, cap):
    ranked = torch.sort(probs, dim=-1, descending=True, stable=True)
    index, top = ranked.indices[:, :top_k], ranked.values[:, :top_k]
    keep = torch.ones_like(index, dtype=torch.bool)
    if cap is not None:
        order = F.one_hot(index.t().reshape(-1), probs.shape[-1])
        keep = (((order.cumsum(0) * order).sum(-1) - 1) < cap).reshape(top_k, -1).t()
    kept = top * keep
    weights = kept / kept.sum(-1, keepdim=True).clamp_min(1e-12)
    return index, weights, keep
