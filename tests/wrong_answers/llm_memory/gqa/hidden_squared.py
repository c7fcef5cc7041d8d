"""4 * hidden**2: right only when num_heads * head_dim == hidden and there is no GQA."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "num_kv_heads"


def attention_params(hidden, num_heads, num_kv_heads, head_dim):
    return 4 * hidden * hidden
