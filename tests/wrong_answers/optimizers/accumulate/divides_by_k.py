"""Divides each micro-batch's loss by k: right only when all micro-batches have the same size."""
import torch

EXPECT = 'len(micro_batch)'


def accumulated_backward(model, criterion, images, labels, k):
    total = 0.0
    for x, y in zip(images.chunk(k), labels.chunk(k)):
        loss = criterion(model(x), y) / k
        loss.backward()
        total += loss.item()
    return total
