"""Numbers the decisions token by token (token 0's first and second choice, then token 1's ...): a second choice can
take the slot a later token's first choice needed. Family: the priority order (inputs that need an overfull expert)."""
import torch
import torch.nn.functional as F

EXPECT = ["token by token", "first choice"]


def route_tokens(probs, top_k, cap):
    ranked = torch.sort(probs, dim=-1, descending=True, stable=True)
    index, top = ranked.indices[:, :top_k], ranked.values[:, :top_k]
    weights = top / top.sum(-1, keepdim=True)
    if cap is None:
        return index, weights, torch.ones_like(index, dtype=torch.bool)
    order = F.one_hot(index.reshape(-1), probs.shape[-1])
    place = ((order.cumsum(0) * order).sum(-1) - 1).reshape(index.shape)
    return index, weights, place < cap
