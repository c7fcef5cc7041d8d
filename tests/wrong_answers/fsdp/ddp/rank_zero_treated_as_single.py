"""Tests ctx.rank == 0 for "one process": rank 0 of a multi-process run trains without DDP, its gradients never averaged."""
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = "DistributedDataParallel"


def wrap_ddp(model, ctx, device):
    model = model.to(device)
    if ctx.rank == 0:
        return model
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
