"""Updates p and m in place (p.sub_, m.mul_): the caller's tensors change."""
import torch

EXPECT = 'in place'


def lion_update(p, g, m, lr, beta1, beta2, weight_decay):
    c = beta1 * m + (1 - beta1) * g
    p.mul_(1 - lr * weight_decay).sub_(lr * torch.sign(c))
    m.mul_(beta2).add_((1 - beta2) * g)
    return p, m
