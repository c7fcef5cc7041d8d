"""Counts places from 1 and keeps place <= cap + 1 by mistake of a shifted count: each expert takes one decision
more than its capacity. Family: a boundary (off by one)."""
import torch
import torch.nn.functional as F

EXPECT = ["one decision too many"]


def route_tokens(probs, top_k, cap):
    ranked = torch.sort(probs, dim=-1, descending=True, stable=True)
    index, top = ranked.indices[:, :top_k], ranked.values[:, :top_k]
    weights = top / top.sum(-1, keepdim=True)
    if cap is None:
        return index, weights, torch.ones_like(index, dtype=torch.bool)
    order = F.one_hot(index.t().reshape(-1), probs.shape[-1])
    place = (order.cumsum(0) * order).sum(-1)  # counts from 1
    return index, weights, (place <= cap + 1).reshape(top_k, -1).t()
