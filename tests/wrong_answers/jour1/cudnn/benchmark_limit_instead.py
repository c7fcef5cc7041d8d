"""A neighbouring setting: benchmark_limit bounds how many algorithms are tried, it does not turn the autotuner on."""
import torch

EXPECT = 'benchmark'


def enable_cudnn_benchmark():
    torch.backends.cudnn.benchmark_limit = 10
