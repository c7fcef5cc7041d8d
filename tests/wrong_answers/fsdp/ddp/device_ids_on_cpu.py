"""device_ids=[local_rank] on the CPU: device_ids is for one GPU per process."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = 'device_ids'


def wrap_ddp(model, ctx, device):
    model = model.to(device)
    if not ctx.is_distributed:
        return model
    return DDP(model, device_ids=[ctx.local_rank])
