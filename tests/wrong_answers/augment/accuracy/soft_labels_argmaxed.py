"""Takes the argmax of soft labels: a prediction of the minority class scores 0 instead of its weight."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "targets[i, prediction_i]"


def mixed_accuracy(logits, targets):
    pred = logits.argmax(dim=1)
    if targets.ndim == 2:
        targets = targets.argmax(dim=1)
    return (pred == targets).float().mean().item()
