"""Converts a deep copy of the model and returns it: the copy is channels_last, but the optimizer built on the given
model updates parameters the returned model does not use. Family: the flag right (channels_last), the object
wrong."""
import copy

import torch

EXPECT = ["another module than the one given"]


def to_channels_last(model, images):
    return copy.deepcopy(model).to(memory_format=torch.channels_last), images.contiguous(memory_format=torch.channels_last)
