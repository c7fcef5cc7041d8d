"""CPUOffloadPolicy(pin_memory=False): pageable memory makes every copy slower."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = 'pin_memory'


def offload_policy(device, enabled):
    if not enabled:
        return OffloadPolicy()
    if device.type != "cuda":
        raise ValueError("offload needs a GPU")
    return CPUOffloadPolicy(pin_memory=False)
