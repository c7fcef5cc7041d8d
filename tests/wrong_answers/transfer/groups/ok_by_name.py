"""Correct: the groups split by parameter name, head first."""


def finetune_param_groups(model, head_lr, backbone_lr):
    head, backbone = [], []
    for name, p in model.named_parameters():
        (head if name.startswith("fc.") else backbone).append(p)
    return [dict(params=head, lr=head_lr), dict(params=backbone, lr=backbone_lr)]
