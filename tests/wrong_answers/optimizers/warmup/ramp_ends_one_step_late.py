"""Family: a boundary off by one. The ramp reaches base_lr at step warmup_steps (over warmup_steps + 1 steps), and
the cosine starts one step later: every rate of the warm-up is too small, step warmup_steps is base_lr."""
import math

EXPECT = "step 0 of 2"


def warmup_cosine_lr(step, total_steps, warmup_steps, base_lr):
    if step <= warmup_steps:
        return base_lr * (step + 1) / (warmup_steps + 1)
    t = (step - warmup_steps - 1) / (total_steps - warmup_steps - 1)
    return base_lr * 0.5 * (1 + math.cos(math.pi * t))
