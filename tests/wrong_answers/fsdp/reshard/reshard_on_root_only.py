"""Passes reshard_after_forward to the root only: the layers keep the default."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = 'reshard_after_forward=False'


def apply_fsdp(model, *, mp_policy=None, reshard_after_forward=True, offload=None):
    kwargs = dict(mp_policy=mp_policy or MixedPrecisionPolicy(), offload_policy=offload or OffloadPolicy())
    for layer in model.model.layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, reshard_after_forward=reshard_after_forward, **kwargs)
    return model
