"""Keeps the raw top-k probabilities as weights (Switch's top-1 habit carried into top-k): a token's weights then sum
to less than 1. Family: part of the result right (the experts chosen are)."""
import torch
import torch.nn.functional as F

EXPECT = ["not renormalised"]


def route_tokens(probs, top_k, cap):
    ranked = torch.sort(probs, dim=-1, descending=True, stable=True)
    index, weights = ranked.indices[:, :top_k], ranked.values[:, :top_k]
    order = F.one_hot(index.t().reshape(-1), probs.shape[-1])
    place = ((order.cumsum(0) * order).sum(-1) - 1).reshape(top_k, -1).t()
    return index, weights, place < cap if cap is not None else torch.ones_like(index, dtype=torch.bool)
