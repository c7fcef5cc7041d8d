"""Gives the head the small rate and the backbone the large one."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "head_lr"


def finetune_param_groups(model, head_lr, backbone_lr):
    head = list(model.fc.parameters())
    ids = {id(p) for p in head}
    return [{"params": [p for p in model.parameters() if id(p) not in ids], "lr": head_lr},
            {"params": head, "lr": backbone_lr}]
