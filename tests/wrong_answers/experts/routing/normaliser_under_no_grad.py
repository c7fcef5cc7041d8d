"""Computes the normaliser (the sum of a token's k probabilities) under torch.no_grad(): the weights have the right
values and still depend on probs, but the router's gradient misses the part through the sum. Family: the values
right, the gradient wrong."""
import torch
import torch.nn.functional as F

EXPECT = ["gradient", "normaliser", "carries no gradient"]


def route_tokens(probs, top_k, cap):
    ranked = torch.sort(probs, dim=-1, descending=True, stable=True)
    index, top = ranked.indices[:, :top_k], ranked.values[:, :top_k]
    with torch.no_grad():
        total = top.sum(-1, keepdim=True)
    weights = top / total
    if cap is None:
        return index, weights, torch.ones_like(index, dtype=torch.bool)
    order = F.one_hot(index.t().reshape(-1), probs.shape[-1])
    return index, weights, (((order.cumsum(0) * order).sum(-1) - 1) < cap).reshape(top_k, -1).t()
