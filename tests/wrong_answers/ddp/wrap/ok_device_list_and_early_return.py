"""Correct: device_ids given as devices only on a GPU, the conversion and the move written in another order."""
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def wrap_model(model, ctx, device, sync_bn=False, bucket_cap_mb=25.0, find_unused_parameters=False):
    model = model.to(device)
    if sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if ctx.world_size == 1:
        return model
    ids = [device] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=bucket_cap_mb,
                                   find_unused_parameters=find_unused_parameters)
