"""Builds the weights from Python numbers (or detached values): right values, but the router receives no gradient
through them. Family: the value right, the behaviour (the gradient) wrong."""
import torch
import torch.nn.functional as F

EXPECT = ["do not depend on probs"]


def route_tokens(probs, top_k, cap):
    ranked = torch.sort(probs.detach(), dim=-1, descending=True, stable=True)
    index, top = ranked.indices[:, :top_k], ranked.values[:, :top_k]
    weights = top / top.sum(-1, keepdim=True)
    if cap is None:
        return index, weights, torch.ones_like(index, dtype=torch.bool)
    order = F.one_hot(index.t().reshape(-1), probs.shape[-1])
    return index, weights, (((order.cumsum(0) * order).sum(-1) - 1) < cap).reshape(top_k, -1).t()
