"""The backbone is taken as the conv weights only: BatchNorm parameters are left out of every group."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "every parameter"


def finetune_param_groups(model, head_lr, backbone_lr):
    backbone = [p for name, p in model.named_parameters() if "conv" in name]
    return [{"params": backbone, "lr": backbone_lr}, {"params": list(model.fc.parameters()), "lr": head_lr}]
