"""Correct: the average updated in place with lerp_ under torch.no_grad(), the weights cast to its dtype, and the same
tensors returned."""
import torch


@torch.no_grad()
def ema_update(ema_params, params, decay):
    for avg, cur in zip(ema_params, params):
        avg.lerp_(cur.to(avg.dtype), 1 - decay)
    return list(ema_params)
