"""Returns a bf16 policy for every name: fp32 runs are no longer fp32."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = 'fp32'


def mixed_precision_policy(precision):
    if precision not in ("fp32", "bf16"):
        raise ValueError(precision)
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
