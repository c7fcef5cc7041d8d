"""rank % device_count: right only when every node runs one process per GPU (not with 2 processes on 4 GPUs)."""
import torch

EXPECT = 'local_rank'


def rank_device(ctx):
    if torch.cuda.is_available():
        return torch.device("cuda", ctx.rank % torch.cuda.device_count())
    return torch.device("cpu")
