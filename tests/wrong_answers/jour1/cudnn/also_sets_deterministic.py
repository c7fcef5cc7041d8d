"""Turns the benchmark flag on and, "to be safe", deterministic too: deterministic restricts cuDNN to
deterministic algorithms, which undoes part of what the autotuner was for. Family: the flag right, another
setting changed."""
import torch

EXPECT = ["also changed deterministic from False to True"]


def enable_cudnn_benchmark():
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.deterministic = True
