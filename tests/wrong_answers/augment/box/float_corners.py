"""Floors with // on floats: the corners come out as floats, which cannot index a slice."""
import math


EXPECT = "Python ints"


def cutmix_box(lam, cy, cx, height, width):
    r = math.sqrt(1.0 - lam)
    h, w = height * r // 1, width * r // 1
    y0, x0 = cy - h // 2, cx - w // 2
    clip = lambda v, hi: min(max(v, 0), hi)  # noqa: E731
    return clip(y0, height), clip(y0 + h, height), clip(x0, width), clip(x0 + w, width)
