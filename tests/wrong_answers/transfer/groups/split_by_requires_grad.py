"""Tells the head from the backbone by requires_grad: with nothing frozen, every parameter lands in the head group."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "backbone_lr"


def finetune_param_groups(model, head_lr, backbone_lr):
    head = [p for p in model.parameters() if p.requires_grad]
    backbone = [p for p in model.parameters() if not p.requires_grad]
    return [{"params": backbone, "lr": backbone_lr}, {"params": head, "lr": head_lr}]
