"""Returns a tensor instead of a float."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "Python float"


def mixed_accuracy(logits, targets):
    pred = logits.argmax(dim=1)
    if targets.ndim == 1:
        return (pred == targets).float().mean()
    return targets.gather(1, pred[:, None]).float().mean()
