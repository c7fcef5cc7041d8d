"""Updates the momentum with beta1 (Adam's habit): Lion uses beta2 there."""
import torch

EXPECT = 'uses beta2'


def lion_update(p, g, m, lr, beta1, beta2, weight_decay):
    c = beta1 * m + (1 - beta1) * g
    new_p = p * (1 - lr * weight_decay) - lr * torch.sign(c)
    new_m = c
    return new_p, new_m
