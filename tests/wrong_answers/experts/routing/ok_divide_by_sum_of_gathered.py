"""A correct alternative: topk (ties resolved by a stable sort first), the weights by a division by the gathered
sum, which stays in the graph."""
import torch


def route_tokens(probs, top_k, cap):
    index = torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, :top_k]
    chosen = probs.gather(-1, index)
    weights = chosen.div(chosen.sum(-1, keepdim=True))
    keep = torch.ones_like(index, dtype=torch.bool)
    if cap is not None:
        flat = index.t().reshape(-1)
        seen = torch.zeros(probs.shape[-1], dtype=torch.long)
        place = torch.empty_like(flat)
        for i, e in enumerate(flat.tolist()):
            place[i] = seen[e]
            seen[e] += 1
        keep = (place < cap).reshape(top_k, -1).t()
    return index, weights, keep
