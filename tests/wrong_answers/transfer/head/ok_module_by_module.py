"""Correct: the head built from the old head's weight shape; the freeze done module by module, each module's own
parameters frozen unless the module is the head."""
from torch import nn


def replace_head(model, n_classes):
    features = model.fc.weight.shape[1]
    model.fc = nn.Linear(features, n_classes, bias=True)
    return model


def freeze_backbone(model):
    for module in model.modules():
        for p in module.parameters(recurse=False):
            p.requires_grad = module is model.fc
    return model
