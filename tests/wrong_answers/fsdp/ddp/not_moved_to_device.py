"""Wraps the model but never moves it to the device it is given: on a GPU run the weights stay in CPU memory."""
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = "model.to(device)"


def wrap_ddp(model, ctx, device):
    if not ctx.is_distributed:
        return model
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
