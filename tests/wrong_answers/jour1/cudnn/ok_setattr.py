"""Correct: the flag set with setattr on torch.backends.cudnn."""
import torch


def enable_cudnn_benchmark():
    setattr(torch.backends.cudnn, "benchmark", True)
