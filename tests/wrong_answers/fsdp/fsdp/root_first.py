"""Shards the root before the layers: the root unit takes every parameter."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = 'FIRST'


def apply_fsdp(model, *, mp_policy=None, reshard_after_forward=True, offload=None):
    kwargs = dict(mp_policy=mp_policy or MixedPrecisionPolicy(), offload_policy=offload or OffloadPolicy(),
                  reshard_after_forward=reshard_after_forward)
    fully_shard(model, **kwargs)
    for layer in model.model.layers:
        fully_shard(layer, **kwargs)
    return model
