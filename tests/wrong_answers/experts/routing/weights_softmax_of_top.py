"""Renormalises with a softmax of the kept probabilities: they sum to 1, but the proportions between the choices are
flattened (a softmax of numbers in [0, 1] is nearly uniform). Family: a flag right (sums to 1), values wrong."""
import torch
import torch.nn.functional as F

EXPECT = ["softmax", "proportion"]


def route_tokens(probs, top_k, cap):
    ranked = torch.sort(probs, dim=-1, descending=True, stable=True)
    index = ranked.indices[:, :top_k]
    weights = torch.softmax(ranked.values[:, :top_k], dim=-1)
    order = F.one_hot(index.t().reshape(-1), probs.shape[-1])
    place = ((order.cumsum(0) * order).sum(-1) - 1).reshape(top_k, -1).t()
    return index, weights, place < cap if cap is not None else torch.ones_like(index, dtype=torch.bool)
