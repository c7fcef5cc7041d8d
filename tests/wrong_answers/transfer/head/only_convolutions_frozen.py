"""Family: part of the result right. Freezes the convolutions only: the BatchNorm weights and biases keep learning."""
from torch import nn

EXPECT = "bn1.weight"


def replace_head(model, n_classes):
    model.fc = nn.Linear(model.fc.in_features, n_classes)
    return model


def freeze_backbone(model):
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            for p in module.parameters():
                p.requires_grad = False
    return model
