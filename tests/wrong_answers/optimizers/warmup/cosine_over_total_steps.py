"""The cosine runs over all total_steps instead of the steps after the warm-up: it never reaches 0."""
import math

import torch

EXPECT = "counted from step 0"


def warmup_cosine_lr(step, total_steps, warmup_steps, base_lr):
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    t = step / total_steps
    return base_lr * 0.5 * (1 + math.cos(math.pi * t))
