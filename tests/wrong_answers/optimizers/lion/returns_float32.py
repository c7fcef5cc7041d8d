"""Family: dtypes. Computes the step in float32 whatever the parameters' dtype: a float64 parameter comes back as
float32, rounded."""
import torch

EXPECT = "expected torch.float64"


def lion_update(p, g, m, lr, beta1, beta2, weight_decay):
    p, g, m = p.float(), g.float(), m.float()
    c = beta1 * m + (1 - beta1) * g
    return p * (1 - lr * weight_decay) - lr * torch.sign(c), beta2 * m + (1 - beta2) * g
