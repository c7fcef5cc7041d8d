"""Builds the channels_last tensor with as_strided on the NCHW storage: the strides are channels_last, the pixels
are read from the wrong places (right only when there is one channel or one pixel). Family: a case that cannot show
the mistake (one channel, 1x1 images)."""
import torch

EXPECT = ["values must not change"]


def to_channels_last(model, images):
    n, c, h, w = images.shape
    nhwc = images.contiguous().as_strided((n, c, h, w), (c * h * w, 1, w * c, c))
    return model.to(memory_format=torch.channels_last), nhwc
