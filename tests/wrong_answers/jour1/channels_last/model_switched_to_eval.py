"""Puts the model in eval mode while converting it ("for speed"): the training that follows runs BatchNorm and
Dropout in their evaluation behaviour. Family: the model left in another state than the one expected."""
import torch

EXPECT = ["given in train mode and returned in eval mode"]


def to_channels_last(model, images):
    model = model.eval().to(memory_format=torch.channels_last)
    return model, images.contiguous(memory_format=torch.channels_last)
