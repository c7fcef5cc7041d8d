"""Recomputes head_dim as hidden / num_kv_heads (the K/V heads are wider, not fewer)."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = ["head_dim", "num_kv_heads"]


def attention_params(hidden, num_heads, num_kv_heads, head_dim):
    kv_head_dim = hidden // num_kv_heads
    return 2 * hidden * num_heads * head_dim + 2 * hidden * num_kv_heads * kv_head_dim
