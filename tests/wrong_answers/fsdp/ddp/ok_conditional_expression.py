"""Correct: the moved model wrapped or not in one conditional expression, device_ids from the device's index only on
a GPU."""
from torch.nn.parallel import DistributedDataParallel


def wrap_ddp(model, ctx, device):
    model = model.to(device)
    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids) if ctx.is_distributed else model
