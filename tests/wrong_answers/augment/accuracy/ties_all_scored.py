"""Scores every class that reaches the largest logit: with tied logits a row scores several classes' weights, where
the prediction (argmax) is one class."""
import torch

EXPECT = ["ties", "expected"]


def mixed_accuracy(logits, targets):
    if targets.ndim == 1:
        targets = torch.nn.functional.one_hot(targets, logits.shape[1]).float()
    hits = (logits == logits.max(dim=1, keepdim=True).values).to(targets.dtype)
    return (hits * targets).sum(dim=1).float().mean().item()
