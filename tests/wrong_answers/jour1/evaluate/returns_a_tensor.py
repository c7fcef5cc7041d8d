"""Returns the accuracy as a tensor (correct / total) instead of a float."""
import torch

EXPECT = 'float'


def evaluate_fast(model, batches):
    model.eval()
    correct, total = 0, 0
    with torch.inference_mode():
        for images, labels in batches:
            correct += (model(images).argmax(dim=1) == labels).sum()
            total += labels.numel()
    return correct / total
