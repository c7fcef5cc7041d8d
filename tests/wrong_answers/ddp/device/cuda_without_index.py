"""torch.device("cuda") has no index: every process of the node uses the current device, GPU 0."""
import torch

EXPECT = 'local_rank'


def rank_device(ctx):
    if torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")
