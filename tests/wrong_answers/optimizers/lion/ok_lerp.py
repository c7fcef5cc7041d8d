"""Correct: the interpolations written with torch.lerp, and the decay applied before the signed step."""
import torch


def lion_update(p, g, m, lr, beta1, beta2, weight_decay):
    direction = torch.lerp(g, m, beta1).sign()
    new_p = p.mul(1 - lr * weight_decay).sub(direction, alpha=lr)
    new_m = torch.lerp(g, m, beta2)
    return new_p, new_m
