"""Tells soft labels from integer labels by dtype == float32: soft labels in bfloat16 or float64 are compared with
the predictions as if they were class indices."""

import torch

EXPECT = ["soft labels in bfloat16"]


def mixed_accuracy(logits, targets):
    pred = logits.argmax(dim=1)
    if targets.dtype == torch.float32:
        return targets.gather(1, pred[:, None]).mean().item()
    return (pred == targets).float().mean().item()
