"""Returns None when disabled instead of the no-offload OffloadPolicy()."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = 'offloads nothing'


def offload_policy(device, enabled):
    if not enabled:
        return None
    if device.type != "cuda":
        raise ValueError("offload needs a GPU")
    return CPUOffloadPolicy(pin_memory=True)
