"""Correct: the head replaced through setattr with the old head's sizes, the freeze decided per parameter by whether it
belongs to the new head."""
from torch import nn


def replace_head(model, n_classes):
    setattr(model, "fc", nn.Linear(model.fc.in_features, n_classes))
    return model


def freeze_backbone(model):
    head = {id(p) for p in model.fc.parameters()}
    for p in model.parameters():
        p.requires_grad_(id(p) in head)
    return model
