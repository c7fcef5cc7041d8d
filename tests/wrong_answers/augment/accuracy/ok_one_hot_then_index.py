"""Correct: integer labels turned into one-hot rows, then one weight per image picked by advanced indexing."""
import torch


def mixed_accuracy(logits, targets):
    if targets.dim() == 1:
        targets = torch.nn.functional.one_hot(targets, logits.shape[1])
    pred = logits.argmax(-1)
    return float(targets.float()[torch.arange(len(pred)), pred].mean())
