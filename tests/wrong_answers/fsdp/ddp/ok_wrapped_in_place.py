"""Correct: moved first, then rebound to the wrapper only when distributed."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP


def wrap_ddp(model, ctx, device):
    model.to(device)
    if ctx.is_distributed:
        ids = None if device.type != "cuda" else [device.index]
        model = DDP(model, device_ids=ids)
    return model
