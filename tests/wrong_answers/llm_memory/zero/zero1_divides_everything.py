"""ZeRO-1 divides all the model states by the number of GPUs (that is ZeRO-3)."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = ["zero1", "optimizer states"]


def model_state_bytes(n_params, n_gpus, strategy):
    n = n_params
    return {"ddp": 16 * n, "zero1": 16 * n / n_gpus, "zero2": 2 * n + 14 * n / n_gpus, "zero3": 16 * n / n_gpus}[strategy]
