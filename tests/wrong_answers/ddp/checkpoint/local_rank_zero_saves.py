"""Inputs that never reach the mistake: saves when ctx.local_rank == 0, so the first process of every node writes
(one node never shows it)."""
import torch
import torch.distributed as dist

from dlo.training.checkpoint import save_checkpoint

EXPECT = 'only rank 0'


def save_on_main(ctx, path, model, optimizer, epoch):
    written = save_checkpoint(path, model=model, optimizer=optimizer, epoch=epoch) if ctx.local_rank == 0 else None
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    return written
