"""Correct: the options collected once in a dict, only those given, then passed to every call."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP


def apply_fsdp(model, *, mp_policy=None, reshard_after_forward=True, offload=None):
    options = {"reshard_after_forward": reshard_after_forward}
    if mp_policy is not None:
        options["mp_policy"] = mp_policy
    if offload is not None:
        options["offload_policy"] = offload
    for block in model.model.layers:
        fully_shard(block, **options)
    fully_shard(model, **options)
    return model
