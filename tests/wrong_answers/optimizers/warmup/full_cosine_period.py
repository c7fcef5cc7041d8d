"""cos(2 pi t): a whole period, so the rate climbs back to base_lr at the end."""
import math

import torch

EXPECT = "full cosine period"


def warmup_cosine_lr(step, total_steps, warmup_steps, base_lr):
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    t = (step - warmup_steps) / (total_steps - warmup_steps)
    return base_lr * 0.5 * (1 + math.cos(2 * math.pi * t))
