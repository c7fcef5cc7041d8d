"""Converts the images, then calls .contiguous() "to be safe": a plain .contiguous() means NCHW, so the tensor is
copied back to the layout it had. Family: the conversion made, its effect undone."""
import torch

EXPECT = ["new tensor", "not laid out channels_last", "contiguous() after the conversion"]


def to_channels_last(model, images):
    model = model.to(memory_format=torch.channels_last)
    images = images.to(memory_format=torch.channels_last).contiguous()
    return model, images
