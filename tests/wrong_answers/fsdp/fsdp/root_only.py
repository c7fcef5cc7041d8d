"""Shards only the root: one unit owns every parameter (one giant all-gather)."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = 'every decoder layer'


def apply_fsdp(model, *, mp_policy=None, reshard_after_forward=True, offload=None):
    fully_shard(model, mp_policy=mp_policy or MixedPrecisionPolicy(), offload_policy=offload or OffloadPolicy(),
                reshard_after_forward=reshard_after_forward)
    return model
