"""Counts k and v at full width: multi-head, not grouped-query, attention."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "num_kv_heads"


def attention_params(hidden, num_heads, num_kv_heads, head_dim):
    return 4 * hidden * num_heads * head_dim
