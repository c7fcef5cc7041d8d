"""Flag set inside the cudnn.flags context manager: it is restored when the block ends, so nothing stays on."""
import torch

EXPECT = 'benchmark'


def enable_cudnn_benchmark():
    with torch.backends.cudnn.flags(enabled=True, benchmark=True):
        pass
