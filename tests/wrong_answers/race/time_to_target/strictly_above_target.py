"""acc > target: an evaluation exactly at the target does not count."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "with >="


def time_to_target(times, accuracies, target):
    for t, acc in zip(times, accuracies):
        if acc > target:
            return t
    return None
