"""Sets torch.backends.cudnn.deterministic: the opposite trade-off of the autotuner."""
import torch

EXPECT = 'benchmark'


def enable_cudnn_benchmark():
    torch.backends.cudnn.deterministic = True
