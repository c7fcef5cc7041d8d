"""Family: a flag set but the behaviour wrong. The backbone's parameters are a generator: the first pass over it
(the optimizer's) uses it up, and anything reading the groups again sees no backbone."""
EXPECT = "list"


def finetune_param_groups(model, head_lr, backbone_lr):
    head = set(model.fc.parameters())
    backbone = (p for p in model.parameters() if p not in head)
    return [{"params": backbone, "lr": backbone_lr}, {"params": list(head), "lr": head_lr}]
