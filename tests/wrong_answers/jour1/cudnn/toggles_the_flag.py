"""Flips the flag instead of setting it: right when it starts off, turns the autotuner off when it was already on.
Family: a case that cannot show the mistake (the flag always off before the call)."""
import torch

EXPECT = ["benchmark=True", "turned it off"]


def enable_cudnn_benchmark():
    torch.backends.cudnn.benchmark = not torch.backends.cudnn.benchmark
