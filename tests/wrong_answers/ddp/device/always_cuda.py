"""Always returns a CUDA device, even on a machine without GPUs."""
import torch
import torch.distributed as dist
from torch import nn

EXPECT = 'cpu'


def rank_device(ctx):
    return torch.device("cuda", ctx.local_rank)
