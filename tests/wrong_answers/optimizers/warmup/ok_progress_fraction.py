"""Correct: the warm-up and the decay written as one progress fraction each, the cosine through cos^2 (the same
half cosine: (1 + cos(pi t)) / 2 = cos(pi t / 2)^2)."""
import math


def warmup_cosine_lr(step, total_steps, warmup_steps, base_lr):
    if step < warmup_steps:
        return base_lr * ((step + 1) / warmup_steps)
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return base_lr * math.cos(math.pi * progress / 2) ** 2
