"""start < epoch: the new size starts one epoch late."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "start <= epoch"


def resolution_at(schedule, epoch):
    size = schedule[0][1]
    for start, side in schedule:
        if start < epoch:
            size = side
    return size
