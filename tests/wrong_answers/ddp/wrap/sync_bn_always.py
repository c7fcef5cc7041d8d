"""Converts to SyncBatchNorm whatever sync_bn says: one all-reduce per BN layer for nothing."""
import torch
import torch.distributed as dist
from torch import nn

EXPECT = 'plain BatchNorm'


from torch.nn.parallel import DistributedDataParallel as DDP


def wrap_model(model, ctx, device, sync_bn=False, bucket_cap_mb=25.0, find_unused_parameters=False):
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if not ctx.is_distributed:
        return model.to(device)
    return DDP(model.to(device), device_ids=None, bucket_cap_mb=bucket_cap_mb, find_unused_parameters=find_unused_parameters)
