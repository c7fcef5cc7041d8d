"""Compares the largest logit (max(1).values) with the labels instead of its index: a flag-style check (eval mode,
no graph, a float returned) passes, the accuracy is wrong. Family: values not checked."""
import torch

EXPECT = ["the accuracy is", "expected"]


def evaluate_fast(model, batches):
    model.eval()
    correct, total = 0, 0
    with torch.inference_mode():
        for images, labels in batches:
            correct += (model(images).max(dim=1).values == labels).sum().item()
            total += labels.numel()
    return correct / total
