"""Returns the first pair that has started instead of the last one."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "the last (start, size)"


def resolution_at(schedule, epoch):
    for start, side in schedule:
        if start <= epoch:
            return side
    return schedule[0][1]
