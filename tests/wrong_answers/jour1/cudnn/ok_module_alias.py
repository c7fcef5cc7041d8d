"""Correct: the flag set through an imported alias of the cudnn backend module."""
from torch.backends import cudnn


def enable_cudnn_benchmark():
    cudnn.benchmark = True
