"""Computes in float16: fp16 needs loss scaling, bf16 does not."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = 'param_dtype=torch.bfloat16'


def mixed_precision_policy(precision):
    if precision == "fp32":
        return None
    if precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32)
    raise ValueError(precision)
