"""Starts the box at (cy, cx): the drawn point becomes its corner, not its centre."""
import math


EXPECT = "centred on (cy, cx)"


def cutmix_box(lam, cy, cx, height, width):
    r = math.sqrt(1.0 - lam)
    h, w = math.floor(height * r), math.floor(width * r)
    return cy, min(cy + h, height), cx, min(cx + w, width)
