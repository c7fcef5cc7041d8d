"""Family: part of the result right. The cosine's progress divided by total_steps - warmup_steps - 1 so that the last
step's rate is exactly 0: one step too short, every rate after the warm-up is a little low (the last step is 0, the others too low)."""
import math

EXPECT = "step 4 of 7"


def warmup_cosine_lr(step, total_steps, warmup_steps, base_lr):
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    t = (step - warmup_steps) / max(1, total_steps - warmup_steps - 1)
    return base_lr * 0.5 * (1 + math.cos(math.pi * t))
