"""Averages the logits, not the probabilities."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "averaged the logits"


def tta_predict(model, images):
    return torch.softmax((model(images) + model(images.flip(-1))) / 2, dim=1)
