"""Family: inputs that never reach the mistake. The sign written with torch.where(c > 0, 1, -1): where the
interpolation is exactly 0 (momentum 0 on the first step and a zero gradient) the weight moves by -lr instead of
staying put. Random inputs never give c = 0."""
import torch

EXPECT = "momentum 0 and some gradients 0"


def lion_update(p, g, m, lr, beta1, beta2, weight_decay):
    c = beta1 * m + (1 - beta1) * g
    direction = torch.where(c > 0, torch.ones_like(c), -torch.ones_like(c))
    return p * (1 - lr * weight_decay) - lr * direction, beta2 * m + (1 - beta2) * g
