"""Puts the barrier inside `if ctx.is_main`: rank 0 waits for ranks that never come (a hang)."""
import torch
import torch.distributed as dist
from torch import nn

from dlo.training.checkpoint import save_checkpoint

EXPECT = 'every rank must call it'


def save_on_main(ctx, path, model, optimizer, epoch):
    if ctx.is_main:
        written = save_checkpoint(path, model=model, optimizer=optimizer, epoch=epoch)
        if dist.is_initialized():
            dist.barrier()
        return written
    return None
