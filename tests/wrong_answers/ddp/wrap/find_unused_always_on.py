"""Flag set, behaviour wrong: find_unused_parameters=True whatever the caller asks (a check that only ever asks for
True does not see it; it costs a traversal of the graph at every step)."""
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = 'find_unused_parameters'


def wrap_model(model, ctx, device, sync_bn=False, bucket_cap_mb=25.0, find_unused_parameters=False):
    if sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(device)
    if not ctx.is_distributed:
        return model
    return DDP(model, bucket_cap_mb=bucket_cap_mb, find_unused_parameters=True)
