"""Correct: DDP's options collected in a dict, device_ids (and output_device) added only on a GPU; the plain model
returned when there is no process group."""
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def wrap_model(model, ctx, device, *, sync_bn=False, bucket_cap_mb=25.0, find_unused_parameters=False):
    if sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(device)
    if not ctx.is_distributed:
        return model
    options = {"bucket_cap_mb": bucket_cap_mb, "find_unused_parameters": find_unused_parameters}
    if device.type == "cuda":
        options.update(device_ids=[device.index], output_device=device.index)
    return DDP(model, **options)
