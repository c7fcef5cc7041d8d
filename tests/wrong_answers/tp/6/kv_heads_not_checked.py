"""Family: refusal missing. Checks that tp divides num_heads but not num_kv_heads: a model with one K/V head is split
unevenly."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'K/V heads'


_Reference = ParallelAttention


class ParallelAttention(_Reference):
    def __init__(self, full, group=None):
        nn.Module.__init__(self)
        self.group, self.head_dim = group, full.head_dim
        tp = group_size(group)
        _divisible("num_heads", full.num_heads, tp, "ParallelAttention")
        self.num_heads, self.num_kv_heads = full.num_heads // tp, max(full.num_kv_heads // tp, 1)
        self.q_proj = ColumnParallelLinear(full.q_proj, group, copy_input=False)
        self.k_proj = ColumnParallelLinear(full.k_proj, group, copy_input=False) if full.num_kv_heads % tp == 0 else full.k_proj
        self.v_proj = ColumnParallelLinear(full.v_proj, group, copy_input=False) if full.num_kv_heads % tp == 0 else full.v_proj
        self.o_proj = RowParallelLinear(full.o_proj, group)
