"""Correct: torch.lerp towards the current weights by (1 - decay), in the average's own dtype."""
import torch


def ema_update(ema_params, params, decay):
    out = []
    for avg, cur in zip(ema_params, params):
        out.append(torch.lerp(avg, cur.detach().to(avg.dtype), 1.0 - decay))
    return out
