"""decay * current + (1 - decay) * ema: the average forgets almost at once."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "decay multiplies the new weights"


def ema_update(ema_params, params, decay):
    return [decay * p.detach() + (1 - decay) * e for e, p in zip(ema_params, params)]
