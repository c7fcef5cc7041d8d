"""Returns a CPU offload policy while training on the CPU: nothing to offload, the error is hidden."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = 'ValueError'


def offload_policy(device, enabled):
    if not enabled:
        return OffloadPolicy()
    return CPUOffloadPolicy(pin_memory=True)
