"""Correct: each tensor moved with keyword arguments, in a generator, returned as a tuple."""
import torch


def to_device(images, labels, device):
    return tuple(t.to(device=device, non_blocking=True) for t in (images, labels))
