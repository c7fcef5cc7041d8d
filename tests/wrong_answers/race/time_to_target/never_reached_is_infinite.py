"""A race that never reaches the target gets float("inf") instead of None."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "None"


def time_to_target(times, accuracies, target):
    for t, acc in zip(times, accuracies):
        if acc >= target:
            return t
    return float("inf")
