"""Puts in the head group every parameter whose name contains "fc": a backbone's own mlp.fc1 / mlp.fc2 layers get the
head's large learning rate."""

EXPECT = ["mlp.fc1", "backbone_lr"]


def finetune_param_groups(model, head_lr, backbone_lr):
    head = [p for name, p in model.named_parameters() if "fc" in name]
    backbone = [p for name, p in model.named_parameters() if "fc" not in name]
    return [{"params": backbone, "lr": backbone_lr}, {"params": head, "lr": head_lr}]
