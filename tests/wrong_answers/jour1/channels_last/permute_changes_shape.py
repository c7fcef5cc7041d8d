"""Permutes the images to NHWC: that changes the shape (and the meaning of each axis), not only the memory layout."""
import torch

EXPECT = "images"


def to_channels_last(model, images):
    return model.to(memory_format=torch.channels_last), images.permute(0, 2, 3, 1).contiguous()
