"""A correct alternative: a stable argsort of the negated probabilities, and each decision's place in its queue from
a running count per expert over the choice-major order."""
import torch


def route_tokens(probs, top_k, cap):
    index = torch.argsort(-probs, dim=-1, stable=True)[:, :top_k]
    top = torch.gather(probs, 1, index)
    weights = top / top.sum(dim=1, keepdim=True)
    if cap is None:
        return index, weights, torch.ones(index.shape, dtype=torch.bool)
    counts = torch.zeros(probs.shape[1], dtype=torch.long)
    keep = torch.zeros(index.shape, dtype=torch.bool)
    for choice in range(top_k):
        for token in range(index.shape[0]):
            e = index[token, choice]
            keep[token, choice] = counts[e] < cap
            counts[e] += 1
    return index, weights, keep
