"""Correct: each tensor moved by its own call, with non_blocking given positionally after the device."""


def to_device(images, labels, device):
    images = images.to(device, non_blocking=True)
    labels = labels.to(device, non_blocking=True)
    return images, labels
