"""Reduces the gradients in bf16 too: the sum over ranks loses precision."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = 'reduce_dtype'


def mixed_precision_policy(precision):
    if precision == "fp32":
        return None
    if precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    raise ValueError(precision)
