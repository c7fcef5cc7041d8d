"""Calls images.contiguous(memory_format=...) without keeping the result: unlike model.to, it returns a new tensor."""
import torch

EXPECT = "convert the images"


def to_channels_last(model, images):
    model = model.to(memory_format=torch.channels_last)
    images.contiguous(memory_format=torch.channels_last)
    return model, images
