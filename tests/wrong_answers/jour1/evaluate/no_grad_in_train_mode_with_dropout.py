"""Turns off autograd but puts only the BatchNorm layers in eval mode: Dropout still drops activations. Family: the
flag set on part of the model."""
import torch

EXPECT = ["still in training mode", "Dropout", "dropped activations"]


def evaluate_fast(model, batches):
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.eval()
    correct, total = 0, 0
    with torch.no_grad():
        for images, labels in batches:
            correct += (model(images).argmax(dim=1) == labels).sum().item()
            total += labels.numel()
    return correct / total
