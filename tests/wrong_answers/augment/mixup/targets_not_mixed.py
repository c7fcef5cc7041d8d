"""Mixes the images but keeps the original targets."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "mixed targets"


def mixup_batch(images, targets, lam, perm):
    lam4 = lam.view(-1, 1, 1, 1).to(images.dtype)
    return lam4 * images + (1 - lam4) * images[perm], targets
