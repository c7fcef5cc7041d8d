"""No torch.inference_mode() / no_grad(): every batch keeps its autograd graph."""
import torch

EXPECT = 'autograd graph'


def evaluate_fast(model, batches):
    model.eval()
    correct, total = 0, 0
    with torch.enable_grad():
        for images, labels in batches:
            correct += (model(images).argmax(dim=1) == labels).sum()
            total += labels.numel()
    return float(correct) / total
