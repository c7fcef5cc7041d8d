"""cuda:{rank}: the global rank points past the node's last GPU on the second node."""
import torch
import torch.distributed as dist
from torch import nn

EXPECT = 'local_rank'


def rank_device(ctx):
    if torch.cuda.is_available():
        return torch.device("cuda", ctx.rank)
    return torch.device("cpu")
