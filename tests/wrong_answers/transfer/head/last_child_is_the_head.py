"""Takes the last child module for the head: right when fc is registered last (a ResNet), wrong when a module is
registered after it (here a final norm), which is then left trainable while the head is frozen."""
from torch import nn

EXPECT = ["fc.weight is frozen"]


def replace_head(model, n_classes):
    model.fc = nn.Linear(model.fc.in_features, n_classes)
    return model


def freeze_backbone(model):
    *backbone, head = model.children()
    for child in backbone:
        child.requires_grad_(False)
    head.requires_grad_(True)
    return model
