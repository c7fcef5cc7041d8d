"""Builds DDP with its defaults: bucket_cap_mb and find_unused_parameters are ignored."""
import torch
import torch.distributed as dist
from torch import nn

EXPECT = 'find_unused_parameters'


from torch.nn.parallel import DistributedDataParallel as DDP


def wrap_model(model, ctx, device, sync_bn=False, bucket_cap_mb=25.0, find_unused_parameters=False):
    if sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(device)
    if not ctx.is_distributed:
        return model
    return DDP(model, device_ids=None)
