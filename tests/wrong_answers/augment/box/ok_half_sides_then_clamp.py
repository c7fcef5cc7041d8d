"""Correct: the sides from the cut ratio through math.floor, the corners clamped with one helper per axis."""
import math


def cutmix_box(lam, cy, cx, height, width):
    ratio = (1.0 - lam) ** 0.5
    h = math.floor(height * ratio)
    w = math.floor(width * ratio)
    top, left = cy - h // 2, cx - w // 2

    def into(v, size):
        return max(0, min(size, v))

    return into(top, height), into(top + h, height), into(left, width), into(left + w, width)
