"""Correct: the CPU case returned first, the GPU built with keyword arguments (type and index)."""
import torch


def rank_device(ctx):
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device(type="cuda", index=ctx.local_rank)
