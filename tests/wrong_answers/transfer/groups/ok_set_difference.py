"""Correct: the backbone as the model's parameters minus the head's, kept in the model's order, head group first."""


def finetune_param_groups(model, head_lr, backbone_lr):
    head = list(model.fc.parameters())
    taken = set(map(id, head))
    rest = [p for p in model.parameters() if id(p) not in taken]
    return [{"lr": head_lr, "params": head}, {"lr": backbone_lr, "params": rest}]
