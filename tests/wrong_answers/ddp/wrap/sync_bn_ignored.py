"""Never converts to SyncBatchNorm: the sync_bn argument is ignored."""
import torch
import torch.distributed as dist
from torch import nn

EXPECT = 'SyncBatchNorm'


from torch.nn.parallel import DistributedDataParallel as DDP


def wrap_model(model, ctx, device, sync_bn=False, bucket_cap_mb=25.0, find_unused_parameters=False):
    model = model.to(device)
    if not ctx.is_distributed:
        return model
    return DDP(model, device_ids=None, bucket_cap_mb=bucket_cap_mb, find_unused_parameters=find_unused_parameters)
