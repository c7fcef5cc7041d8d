"""Scales the gradients right but returns the sum of the unweighted losses."""
import torch

EXPECT = "sum of the micro-batches' mean losses"


def accumulated_backward(model, criterion, images, labels, k):
    total = 0.0
    for x, y in zip(images.chunk(k), labels.chunk(k)):
        loss = criterion(model(x), y)
        (loss * (len(x) / len(images))).backward()
        total += loss.item()
    return total
