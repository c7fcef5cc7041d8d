"""Family: a flag set but the behaviour wrong. Returns the policy class itself, not a policy: FSDP gets a type and
never reads a pin_memory setting from it."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = "enabled on a GPU"


def offload_policy(device, enabled):
    if not enabled:
        return OffloadPolicy()
    if device.type != "cuda":
        raise ValueError("offload needs a GPU")
    return CPUOffloadPolicy
