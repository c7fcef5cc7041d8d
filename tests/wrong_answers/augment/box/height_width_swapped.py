"""Takes the box's height from the image width and its width from the height: wrong on non-square images."""
import math


EXPECT = "height and width swapped"


def cutmix_box(lam, cy, cx, height, width):
    r = math.sqrt(1.0 - lam)
    h, w = math.floor(width * r), math.floor(height * r)
    y0, x0 = cy - h // 2, cx - w // 2
    clip = lambda v, hi: min(max(v, 0), hi)  # noqa: E731
    return clip(y0, height), clip(y0 + h, height), clip(x0, width), clip(x0 + w, width)
