"""The cosine's phase is not shifted by the warm-up: it starts below base_lr right after the warm-up."""
import math

import torch

EXPECT = "not shifted"


def warmup_cosine_lr(step, total_steps, warmup_steps, base_lr):
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    t = step / (total_steps - warmup_steps)
    return base_lr * 0.5 * (1 + math.cos(math.pi * t))
