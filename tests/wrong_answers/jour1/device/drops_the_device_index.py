"""Moves to device.type ("cuda"): right on a machine with one GPU, but the index is lost, so on the second GPU the
tensors go to the current device instead. Family: a case that cannot show the mistake (only cuda:0 or the CPU)."""
import torch

EXPECT = ["asked for cuda:1", "went to cuda"]


def to_device(images, labels, device):
    return images.to(device.type, non_blocking=True), labels.to(device.type, non_blocking=True)
