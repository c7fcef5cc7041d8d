"""Uses 1 - lam for the sides: the box's area is then (1 - lam)^2, not 1 - lam."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "square root"


def cutmix_box(lam, cy, cx, height, width):
    h, w = math.floor(height * (1 - lam)), math.floor(width * (1 - lam))
    y0, x0 = cy - h // 2, cx - w // 2
    clip = lambda v, hi: min(max(v, 0), hi)  # noqa: E731
    return clip(y0, height), clip(y0 + h, height), clip(x0, width), clip(x0 + w, width)
