"""Family: sizes that coincide. Gives every rank exactly one K/V head (as if num_kv_heads == tp): wrong as soon as a
rank holds several."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'num_kv_heads / tp'


class ParallelAttention(nn.Module):
    def __init__(self, full, group=None):
        super().__init__()
        self.group, self.head_dim = group, full.head_dim
        tp = group_size(group)
        _divisible("num_heads", full.num_heads, tp, "ParallelAttention")
        _divisible("num_kv_heads", full.num_kv_heads, tp, "ParallelAttention")
        self.num_heads, self.num_kv_heads = full.num_heads // tp, 1
        self.q_proj = ColumnParallelLinear(full.q_proj, group, copy_input=False)
        self.k_proj = ColumnParallelLinear(full.k_proj, group, copy_input=False)
        self.v_proj = ColumnParallelLinear(full.v_proj, group, copy_input=False)
        self.o_proj = RowParallelLinear(full.o_proj, group)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        x = copy_to_region(x, self.group)
        q = self.q_proj(x).view(b, s, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, k, cos, sin)
        out = causal_attention(q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, self.num_heads * self.head_dim))
