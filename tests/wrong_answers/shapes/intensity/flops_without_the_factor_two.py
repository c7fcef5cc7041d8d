"""Counts m*n*k FLOPs: a multiply-add is two operations."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "2*m*n*k"


def arithmetic_intensity(m, n, k, bytes_per_element):
    return m * n * k / ((m * k + k * n + m * n) * bytes_per_element)
