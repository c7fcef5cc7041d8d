"""Correct: the device built from a string with the local rank."""
import torch


def rank_device(ctx):
    return torch.device(f"cuda:{ctx.local_rank}") if torch.cuda.is_available() else torch.device("cpu")
