"""Waits first, then saves: the others leave the barrier before the file exists."""
import torch
import torch.distributed as dist
from torch import nn

from dlo.training.checkpoint import save_checkpoint

EXPECT = 'before the checkpoint existed'


def save_on_main(ctx, path, model, optimizer, epoch):
    if dist.is_initialized():
        dist.barrier()
    return save_checkpoint(path, model=model, optimizer=optimizer, epoch=epoch) if ctx.is_main else None
