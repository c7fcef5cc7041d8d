"""Passes device_ids=[local_rank] on the CPU: device_ids is for one GPU per process."""
import torch
import torch.distributed as dist
from torch import nn

EXPECT = 'device_ids'


from torch.nn.parallel import DistributedDataParallel as DDP


def wrap_model(model, ctx, device, sync_bn=False, bucket_cap_mb=25.0, find_unused_parameters=False):
    if sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(device)
    if not ctx.is_distributed:
        return model
    return DDP(model, device_ids=[ctx.local_rank], bucket_cap_mb=bucket_cap_mb, find_unused_parameters=find_unused_parameters)
