"""Moves a box that crosses the border back inside with its full size, instead of clipping it."""
import math


EXPECT = "not moved inside"


def cutmix_box(lam, cy, cx, height, width):
    r = math.sqrt(1.0 - lam)
    h, w = math.floor(height * r), math.floor(width * r)
    y0 = min(max(cy - h // 2, 0), height - h)
    x0 = min(max(cx - w // 2, 0), width - w)
    return y0, y0 + h, x0, x0 + w
