"""Mirrors the images upside down (flip of the height axis)."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "up-down flip"


def tta_predict(model, images):
    views = [images, images.flip(-2)]
    return torch.stack([torch.softmax(model(v), dim=1) for v in views]).mean(dim=0)
