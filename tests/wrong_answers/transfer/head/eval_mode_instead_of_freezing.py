"""Family: a flag set but the behaviour wrong. Puts the backbone in eval mode: BatchNorm stops updating its
statistics, but every weight still receives gradients and learns."""
from torch import nn

EXPECT = "requires_grad"


def replace_head(model, n_classes):
    model.fc = nn.Linear(model.fc.in_features, n_classes)
    return model


def freeze_backbone(model):
    for name, child in model.named_children():
        if name != "fc":
            child.eval()
    return model
