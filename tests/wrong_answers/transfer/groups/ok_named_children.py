"""Correct: the groups built from the model's children (everything but fc, then fc), backbone first."""


def finetune_param_groups(model, head_lr, backbone_lr):
    backbone = [p for name, child in model.named_children() if name != "fc" for p in child.parameters()]
    backbone += [p for p in model.parameters(recurse=False)]
    return [{"params": backbone, "lr": backbone_lr}, {"params": list(model.fc.parameters()), "lr": head_lr}]
