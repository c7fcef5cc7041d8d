"""Correct: requires_grad_(False) on every child but the head, and the head built from the old one's sizes."""
from torch import nn


def replace_head(model, n_classes):
    old = model.fc
    model.fc = nn.Linear(old.in_features, n_classes, bias=old.bias is not None)
    return model


def freeze_backbone(model):
    for name, child in model.named_children():
        child.requires_grad_(name == "fc")
    return model
