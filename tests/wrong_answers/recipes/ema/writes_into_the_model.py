"""Right average, but written back into the model's own weights (as if loading the EMA into the model)."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "do not modify"


def ema_update(ema_params, params, decay):
    out = []
    for e, p in zip(ema_params, params):
        new = decay * e + (1 - decay) * p.detach()
        p.data.copy_(new)
        out.append(new)
    return out
