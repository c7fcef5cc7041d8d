"""Family: inputs that never reach the mistake (True for every layer hides it). Passes the caller's choice to every
layer but the last, which keeps its weights: the choice no longer reaches every layer."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = "every layer"


def apply_fsdp(model, *, mp_policy=None, reshard_after_forward=True, offload=None):
    layers = model.model.layers
    for i, layer in enumerate(layers):
        last = i == len(layers) - 1
        fully_shard(layer, mp_policy=mp_policy or MixedPrecisionPolicy(), offload_policy=offload or OffloadPolicy(),
                    reshard_after_forward=False if last else reshard_after_forward)
    fully_shard(model, mp_policy=mp_policy or MixedPrecisionPolicy(), offload_policy=offload or OffloadPolicy(),
                reshard_after_forward=reshard_after_forward)
    return model
