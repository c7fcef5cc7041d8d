"""Mixes m and g with beta2 for the direction (the betas swapped)."""
import torch

EXPECT = 'beta2'


def lion_update(p, g, m, lr, beta1, beta2, weight_decay):
    c = beta2 * m + (1 - beta2) * g
    new_p = p * (1 - lr * weight_decay) - lr * torch.sign(c)
    new_m = beta2 * m + (1 - beta2) * g
    return new_p, new_m
