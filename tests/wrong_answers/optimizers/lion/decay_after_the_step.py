"""Family: a difference too small for a loose tolerance. The weight decay applied after the signed step, to the
updated weights: (p - lr * sign(c)) * (1 - lr * wd), off by lr² · wd per coordinate (1e-5 with lr=0.01, wd=0.1)."""
import torch

EXPECT = "new_p differs"


def lion_update(p, g, m, lr, beta1, beta2, weight_decay):
    c = beta1 * m + (1 - beta1) * g
    new_p = (p - lr * torch.sign(c)) * (1 - lr * weight_decay)
    return new_p, beta2 * m + (1 - beta2) * g
