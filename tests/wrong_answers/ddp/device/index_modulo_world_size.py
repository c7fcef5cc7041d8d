"""rank % world_size is the rank itself: the same mistake as the global rank."""
import torch
import torch.distributed as dist
from torch import nn

EXPECT = 'local_rank'


def rank_device(ctx):
    if torch.cuda.is_available():
        return torch.device("cuda", ctx.rank % ctx.world_size)
    return torch.device("cpu")
