"""Counts q, k and v but not the output projection o_proj."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "o_proj"


def attention_params(hidden, num_heads, num_kv_heads, head_dim):
    return hidden * num_heads * head_dim + 2 * hidden * num_kv_heads * head_dim
