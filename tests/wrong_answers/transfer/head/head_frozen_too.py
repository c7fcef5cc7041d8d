"""Freezes every parameter, the new head included: nothing learns."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "fc.weight, fc.bias"


def replace_head(model, n_classes):
    model.fc = nn.Linear(model.fc.in_features, n_classes)
    return model


def freeze_backbone(model):
    for p in model.parameters():
        p.requires_grad = False
    return model
