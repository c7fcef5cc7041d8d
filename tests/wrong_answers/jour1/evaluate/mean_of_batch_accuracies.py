"""Averages the per-batch accuracies: wrong when the last batch is smaller."""
import torch

EXPECT = 'averaged the batches'


def evaluate_fast(model, batches):
    model.eval()
    accs = []
    with torch.inference_mode():
        for images, labels in batches:
            accs.append((model(images).argmax(dim=1) == labels).float().mean().item())
    return sum(accs) / len(accs)
