"""Saves on rank 0 and returns at once: the other ranks may read the file before it exists."""
import torch
import torch.distributed as dist
from torch import nn

from dlo.training.checkpoint import save_checkpoint

EXPECT = 'every rank must call it'


def save_on_main(ctx, path, model, optimizer, epoch):
    return save_checkpoint(path, model=model, optimizer=optimizer, epoch=epoch) if ctx.is_main else None
