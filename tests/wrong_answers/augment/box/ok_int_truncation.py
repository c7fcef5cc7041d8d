"""Correct: int() truncates like floor for these non-negative sides; the clipping written with sorted bounds."""
import math


def cutmix_box(lam, cy, cx, height, width):
    side = math.sqrt(1 - lam)
    h = int(height * side)
    w = int(width * side)
    top, left = cy - h // 2, cx - w // 2
    y0, y1 = max(0, top), min(height, max(0, top + h))
    x0, x1 = max(0, left), min(width, max(0, left + w))
    return min(y0, height), y1, min(x0, width), x1
