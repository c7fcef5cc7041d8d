"""Sums the micro-batches' mean losses: the gradient is k times too large."""
import torch

EXPECT = 'len(micro_batch)'


def accumulated_backward(model, criterion, images, labels, k):
    total = 0.0
    for x, y in zip(images.chunk(k), labels.chunk(k)):
        loss = criterion(model(x), y)
        loss.backward()
        total += loss.item()
    return total
