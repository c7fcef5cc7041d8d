"""12 bytes per parameter: fp32 weights and two Adam moments, forgetting the bf16 weights and gradients of mixed precision."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "16 bytes"


def model_state_bytes(n_params, n_gpus, strategy):
    n = n_params
    return {"ddp": 12 * n, "zero1": 12 * n / n_gpus, "zero2": 12 * n / n_gpus, "zero3": 12 * n / n_gpus}[strategy]
