"""torch.save(model.state_dict()) of the DDP wrapper: every key starts with 'module.', a plain model cannot load it."""
import torch
import torch.distributed as dist
from torch import nn

from dlo.training.checkpoint import save_checkpoint

EXPECT = 'module.'


def save_on_main(ctx, path, model, optimizer, epoch):
    written = None
    if ctx.is_main:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, path)
        written = path
    if dist.is_initialized():
        dist.barrier()
    return written
