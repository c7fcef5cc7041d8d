"""Wraps in DDP even with one process: no process group exists then."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = 'unwrapped'


def wrap_ddp(model, ctx, device):
    return DDP(model.to(device), device_ids=None)
