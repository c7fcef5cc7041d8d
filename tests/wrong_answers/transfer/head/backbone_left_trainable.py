"""Replaces the head but freezes nothing."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "requires_grad must be False"


def replace_head(model, n_classes):
    model.fc = nn.Linear(model.fc.in_features, n_classes)
    return model


def freeze_backbone(model):
    return model
