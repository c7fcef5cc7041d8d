"""Uses torch.topk, whose order among equal probabilities is not the stated one (nor promised at all): right on
random probabilities, wrong on tied ones. Family: inputs that never reach the mistake (no ties)."""
import torch
import torch.nn.functional as F

EXPECT = ["equal probabilities", "lower expert index"]


def route_tokens(probs, top_k, cap):
    top, index = probs.topk(top_k, dim=-1)
    flip = torch.zeros_like(index, dtype=torch.bool)
    flip[:, :] = (top[:, :1] == top).all(-1, keepdim=True) & (top_k > 1)
    index = torch.where(flip, index.sort(-1, descending=True).values, index)  # ties: higher index first
    weights = top / top.sum(-1, keepdim=True)
    if cap is None:
        return index, weights, torch.ones_like(index, dtype=torch.bool)
    order = F.one_hot(index.t().reshape(-1), probs.shape[-1])
    place = ((order.cumsum(0) * order).sum(-1) - 1).reshape(top_k, -1).t()
    return index, weights, place < cap
