"""Passes the precision policy but never the offload policy."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = 'offload'


def apply_fsdp(model, *, mp_policy=None, reshard_after_forward=True, offload=None):
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp_policy or MixedPrecisionPolicy(), reshard_after_forward=reshard_after_forward)
    fully_shard(model, mp_policy=mp_policy or MixedPrecisionPolicy(), reshard_after_forward=reshard_after_forward)
    return model
