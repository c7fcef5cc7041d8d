"""Inputs that never reach the mistake: bucket_cap_mb rounded to whole megabytes with int() (a cap of 1.0 or 25.0 MB
never shows it; 2.5 MB becomes 2)."""
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = 'bucket_cap_mb'


def wrap_model(model, ctx, device, sync_bn=False, bucket_cap_mb=25.0, find_unused_parameters=False):
    if sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(device)
    if not ctx.is_distributed:
        return model
    return DDP(model, bucket_cap_mb=int(bucket_cap_mb), find_unused_parameters=find_unused_parameters)
