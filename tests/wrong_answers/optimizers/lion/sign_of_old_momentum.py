"""Steps along sign(m): the old momentum, without the current gradient."""
import torch

EXPECT = 'sign(m)'


def lion_update(p, g, m, lr, beta1, beta2, weight_decay):
    c = m
    new_p = p * (1 - lr * weight_decay) - lr * torch.sign(c)
    new_m = beta2 * m + (1 - beta2) * g
    return new_p, new_m
