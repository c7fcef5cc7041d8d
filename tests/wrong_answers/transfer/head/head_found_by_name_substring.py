"""Tells the head by a substring of the parameter's name: every name containing "fc" stays trainable, so a backbone's
own layers named mlp.fc1 / mlp.fc2 keep learning (a ResNet has none, so it looks right there)."""
from torch import nn

EXPECT = ["mlp.fc1", "requires_grad must be False"]


def replace_head(model, n_classes):
    model.fc = nn.Linear(model.fc.in_features, n_classes)
    return model


def freeze_backbone(model):
    for name, p in model.named_parameters():
        p.requires_grad = "fc" in name
    return model
