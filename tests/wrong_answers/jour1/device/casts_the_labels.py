"""Moves both tensors and turns the labels into floats on the way: cross-entropy wants class indices (int64).
Family: the flag right (non_blocking, the device), the values not checked."""
import torch

EXPECT = ["labels", "dtype", "int64"]


def to_device(images, labels, device):
    return images.to(device, non_blocking=True), labels.to(device, torch.float32, non_blocking=True)
