"""Reinterprets the NCHW buffer as NHWC with as_strided/view: the layout changes but the pixels are scrambled."""
import torch

EXPECT = "values must not change"


def to_channels_last(model, images):
    model = model.to(memory_format=torch.channels_last)
    n, c, h, w = images.shape
    nhwc = images.contiguous().view(n, h, w, c)  # the same bytes read as NHWC
    return model, nhwc.permute(0, 3, 1, 2)
