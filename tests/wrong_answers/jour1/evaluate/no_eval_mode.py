"""Forgets model.eval(): BatchNorm normalises with the batch's statistics (and updates them)."""
import torch

EXPECT = 'training mode'


def evaluate_fast(model, batches):
    pass
    correct, total = 0, 0
    with torch.inference_mode():
        for images, labels in batches:
            correct += (model(images).argmax(dim=1) == labels).sum()
            total += labels.numel()
    return float(correct) / total
