"""Puts every parameter in the backbone group, head included: the optimizer refuses a parameter in two groups."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "one group only"


def finetune_param_groups(model, head_lr, backbone_lr):
    return [{"params": list(model.parameters()), "lr": backbone_lr},
            {"params": list(model.fc.parameters()), "lr": head_lr}]
