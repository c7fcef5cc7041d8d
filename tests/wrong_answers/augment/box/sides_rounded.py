"""Rounds the sides to the nearest pixel instead of truncating them."""
import math


EXPECT = "truncated, not rounded"


def cutmix_box(lam, cy, cx, height, width):
    r = math.sqrt(1.0 - lam)
    h, w = round(height * r), round(width * r)
    y0, x0 = cy - h // 2, cx - w // 2
    clip = lambda v, hi: min(max(v, 0), hi)  # noqa: E731
    return clip(y0, height), clip(y0 + h, height), clip(x0, width), clip(x0 + w, width)
