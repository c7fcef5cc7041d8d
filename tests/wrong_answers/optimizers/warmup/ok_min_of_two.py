"""Correct: the warm-up as a min() against 1 and the cosine written with its phase in [0, 1]."""
import math


def warmup_cosine_lr(step, total_steps, warmup_steps, base_lr):
    if step >= warmup_steps:
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return base_lr * (1 + math.cos(math.pi * progress)) / 2
    return base_lr * min(1.0, (step + 1) / warmup_steps)
