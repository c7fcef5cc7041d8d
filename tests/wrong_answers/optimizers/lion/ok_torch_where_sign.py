"""Correct: the sign written with torch.where (0 where the interpolation is 0), the decay and the step subtracted
apart."""
import torch


def lion_update(p, g, m, lr, beta1, beta2, weight_decay):
    c = m * beta1 + g * (1 - beta1)
    sign = torch.where(c > 0, torch.ones_like(c), torch.where(c < 0, -torch.ones_like(c), torch.zeros_like(c)))
    new_p = p - lr * weight_decay * p - lr * sign
    return new_p, m * beta2 + g * (1 - beta2)
