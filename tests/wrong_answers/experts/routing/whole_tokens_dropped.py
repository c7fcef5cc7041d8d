"""Drops a whole token as soon as one of its choices is past capacity. Family: the unit of the drop rule (a
decision, not a token)."""
import torch
import torch.nn.functional as F

EXPECT = ["whole tokens"]


def route_tokens(probs, top_k, cap):
    ranked = torch.sort(probs, dim=-1, descending=True, stable=True)
    index, top = ranked.indices[:, :top_k], ranked.values[:, :top_k]
    weights = top / top.sum(-1, keepdim=True)
    if cap is None:
        return index, weights, torch.ones_like(index, dtype=torch.bool)
    order = F.one_hot(index.t().reshape(-1), probs.shape[-1])
    fits = (((order.cumsum(0) * order).sum(-1) - 1) < cap).reshape(top_k, -1).t()
    return index, weights, fits.all(-1, keepdim=True).expand_as(fits).clone()
