"""Counts 4 bytes per parameter (fp16 weights and gradients): the fp32 master copy and Adam's moments are missing."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "16 bytes"


def model_state_bytes(n_params, n_gpus, strategy):
    n = n_params
    return {"ddp": 4 * n, "zero1": 4 * n, "zero2": 2 * n + 2 * n / n_gpus, "zero3": 4 * n / n_gpus}[strategy]
