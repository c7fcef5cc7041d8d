"""Correct: clears the gradients first (the caller's are already cleared: harmless), sums the per-sample losses of
each micro-batch (reduction='sum' through the mean times the size) and divides once by the batch size."""
import torch


def accumulated_backward(model, criterion, images, labels, k):
    model.zero_grad(set_to_none=True)
    n = len(images)
    total = torch.zeros(())
    for x, y in zip(torch.chunk(images, k), torch.chunk(labels, k)):
        loss = criterion(model(x), y) * len(x) / n
        loss.backward()
        total += loss.detach()
    return float(total)
