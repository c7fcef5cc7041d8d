"""Family: inputs that never reach the mistake. Wraps in DDP with a communication hook that sums the gradients over
the ranks instead of averaging them: on one process the sum is the average, on N processes every step is N times
too large."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = ["on 2 processes", "reference: torch's DistributedDataParallel"]


def _sum_hook(state, bucket):
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda fut: fut.value()[0])


def wrap_ddp(model, ctx, device):
    model = model.to(device)
    if not ctx.is_distributed:
        return model
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    ddp.register_comm_hook(None, _sum_hook)
    return ddp
