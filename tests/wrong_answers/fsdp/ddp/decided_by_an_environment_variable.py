"""Family: a flag set but the behaviour wrong. Decides from WORLD_SIZE in the environment instead of the context it
is given: the launcher's variables may say nothing (a notebook, a test, another launcher)."""
import os

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = "ctx.is_distributed"


def wrap_ddp(model, ctx, device):
    model = model.to(device)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    return model
