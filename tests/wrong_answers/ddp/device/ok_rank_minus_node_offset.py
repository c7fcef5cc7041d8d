"""Correct: the node's first global rank subtracted from the global rank (what local_rank is under torchrun)."""
import torch


def rank_device(ctx):
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", ctx.rank - ctx.node_rank * ctx.local_world_size)
