"""Family: part of the result right. The warm-up is right, but the decay afterwards is linear, not half a cosine."""
EXPECT = "linear decay"


def warmup_cosine_lr(step, total_steps, warmup_steps, base_lr):
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    return base_lr * (1 - (step - warmup_steps) / (total_steps - warmup_steps))
