"""A correct alternative, in plain loops: sort each row by (-probability, expert), then serve the queues choice by
choice with a counter per expert."""
import torch


def route_tokens(probs, top_k, cap):
    n, e = probs.shape
    rows = [sorted(range(e), key=lambda j, r=r: (-float(probs[r, j].detach()), j))[:top_k] for r in range(n)]
    index = torch.tensor(rows, dtype=torch.long).reshape(n, top_k)
    top = probs.gather(1, index)
    weights = top / top.sum(-1, keepdim=True)
    keep = torch.ones(n, top_k, dtype=torch.bool)
    if cap is not None:
        used = [0] * e
        for choice in range(top_k):
            for token in range(n):
                expert = int(index[token, choice])
                keep[token, choice] = used[expert] < cap
                used[expert] += 1
    return index, weights, keep
