"""Never passes mp_policy / offload to fully_shard: a bf16 run then trains in fp32."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = 'mp_policy'


def apply_fsdp(model, *, mp_policy=None, reshard_after_forward=True, offload=None):
    for layer in model.model.layers:
        fully_shard(layer, reshard_after_forward=reshard_after_forward)
    fully_shard(model, reshard_after_forward=reshard_after_forward)
    return model
