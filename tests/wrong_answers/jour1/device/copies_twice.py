"""Moves each tensor twice (once blocking, once not): two copies per batch."""
import torch

EXPECT = 'exactly once'


def to_device(images, labels, device):
    images, labels = images.to(device), labels.to(device)
    return images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
