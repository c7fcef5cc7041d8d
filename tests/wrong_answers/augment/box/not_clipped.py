"""Does not clip the box at the image's borders: negative or too large indices."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "clip it"


def cutmix_box(lam, cy, cx, height, width):
    r = math.sqrt(1.0 - lam)
    h, w = math.floor(height * r), math.floor(width * r)
    y0, x0 = cy - h // 2, cx - w // 2
    return y0, y0 + h, x0, x0 + w
