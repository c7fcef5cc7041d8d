"""Assigns a local name called benchmark: the backend's flag never changes."""
import torch

EXPECT = 'benchmark'


def enable_cudnn_benchmark():
    benchmark = True
    return benchmark
