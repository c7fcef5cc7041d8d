"""Weights the targets by the softmax probabilities instead of scoring the predicted class."""

import torch

EXPECT = "softmax"


def mixed_accuracy(logits, targets):
    if targets.ndim == 1:
        return (logits.argmax(dim=1) == targets).float().mean().item()
    return (torch.softmax(logits, dim=1) * targets).sum(dim=1).mean().item()
