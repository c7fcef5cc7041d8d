"""Stage boundaries shifted: ZeRO-2 also shards the bf16 weights (only ZeRO-3 does)."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = ["zero2", "weights"]


def model_state_bytes(n_params, n_gpus, strategy):
    n = n_params
    return {"ddp": 16 * n, "zero1": 4 * n + 12 * n / n_gpus, "zero2": 16 * n / n_gpus, "zero3": 16 * n / n_gpus}[strategy]
