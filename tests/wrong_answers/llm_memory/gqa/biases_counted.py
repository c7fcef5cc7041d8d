"""Adds a bias to each projection: Llama's q/k/v/o projections have none."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "bias"


def attention_params(hidden, num_heads, num_kv_heads, head_dim):
    q = hidden * num_heads * head_dim + num_heads * head_dim
    k = v = hidden * num_kv_heads * head_dim + num_kv_heads * head_dim
    o = num_heads * head_dim * hidden + hidden
    return q + k + v + o
