"""Mixes into the input tensor in place: the caller's batch is changed."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "in place"


def mixup_batch(images, targets, lam, perm):
    lam4 = lam.view(-1, 1, 1, 1).to(images.dtype)
    other = images[perm]
    images.mul_(lam4).add_((1 - lam4) * other)
    lam2 = lam.view(-1, 1).to(targets.dtype)
    return images, lam2 * targets + (1 - lam2) * targets[perm]
