"""flip(1) on an NCHW batch reverses the colour channels (RGB -> BGR), not the image left-right."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = ["dim 1", "channels"]


def tta_predict(model, images):
    views = [images, images.flip(1)]
    return torch.stack([torch.softmax(model(v), dim=1) for v in views]).mean(dim=0)
