"""The ramp is step / warmup_steps: step 0 gets a learning rate of 0 (a wasted step)."""
import math

import torch

EXPECT = 'step 0 of'


def warmup_cosine_lr(step, total_steps, warmup_steps, base_lr):
    if step < warmup_steps:
        return base_lr * step / warmup_steps
    t = (step - warmup_steps) / (total_steps - warmup_steps)
    return base_lr * 0.5 * (1 + math.cos(math.pi * t))
