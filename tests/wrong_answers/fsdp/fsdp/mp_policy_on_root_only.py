"""Gives the mixed precision policy to the root only: the layers (nearly all the compute) stay fp32."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = 'mp_policy'


def apply_fsdp(model, *, mp_policy=None, reshard_after_forward=True, offload=None):
    for layer in model.model.layers:
        fully_shard(layer, reshard_after_forward=reshard_after_forward, offload_policy=offload or OffloadPolicy())
    fully_shard(model, mp_policy=mp_policy or MixedPrecisionPolicy(), offload_policy=offload or OffloadPolicy(),
                reshard_after_forward=reshard_after_forward)
    return model
