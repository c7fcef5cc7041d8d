"""Family: part of the result right. The new head has no bias: the shape is right but the head cannot learn an
offset per class as the pretrained one did."""
from torch import nn

EXPECT = "bias"


def replace_head(model, n_classes):
    model.fc = nn.Linear(model.fc.in_features, n_classes, bias=False)
    return model


def freeze_backbone(model):
    for name, p in model.named_parameters():
        p.requires_grad = name.startswith("fc.")
    return model
