"""Sets torch.backends.cudnn.enabled: cuDNN is on already; benchmark is the autotuner."""
import torch

EXPECT = 'benchmark'


def enable_cudnn_benchmark():
    torch.backends.cudnn.enabled = True
