"""Correct: inference_mode, the counts kept as tensors and turned into a number once at the end."""
import torch


def evaluate_fast(model, batches):
    model.eval()
    correct = torch.zeros((), dtype=torch.long)
    seen = 0
    with torch.inference_mode():
        for images, labels in batches:
            correct += (model(images).argmax(dim=-1) == labels).sum().cpu()
            seen += labels.numel()
    return correct.item() / seen
