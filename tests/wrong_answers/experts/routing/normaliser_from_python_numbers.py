"""Rebuilds each token's normaliser from Python numbers (.item()): the weights have the right values and still
depend on probs through the numerator, but the gradient misses the part through the sum. Family: the values right,
the gradient wrong."""
import torch
import torch.nn.functional as F

EXPECT = ["gradient", "carries no gradient"]


def route_tokens(probs, top_k, cap):
    ranked = torch.sort(probs, dim=-1, descending=True, stable=True)
    index, top = ranked.indices[:, :top_k], ranked.values[:, :top_k]
    sums = torch.tensor([[row.sum().item()] for row in top], dtype=probs.dtype)
    weights = top / sums
    if cap is None:
        return index, weights, torch.ones_like(index, dtype=torch.bool)
    order = F.one_hot(index.t().reshape(-1), probs.shape[-1])
    return index, weights, (((order.cumsum(0) * order).sum(-1) - 1) < cap).reshape(top_k, -1).t()
