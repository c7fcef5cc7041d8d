"""Wraps in DDP even with one process (no process group exists then)."""
import torch
import torch.distributed as dist
from torch import nn

EXPECT = 'unwrapped'


from torch.nn.parallel import DistributedDataParallel as DDP


def wrap_model(model, ctx, device, sync_bn=False, bucket_cap_mb=25.0, find_unused_parameters=False):
    if sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return DDP(model.to(device), device_ids=None, bucket_cap_mb=bucket_cap_mb, find_unused_parameters=find_unused_parameters)
