"""Forgets the decoupled weight decay."""
import torch

EXPECT = 'weight decay is missing'


def lion_update(p, g, m, lr, beta1, beta2, weight_decay):
    c = beta1 * m + (1 - beta1) * g
    new_p = p - lr * torch.sign(c)
    new_m = beta2 * m + (1 - beta2) * g
    return new_p, new_m
