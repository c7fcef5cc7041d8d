"""Family: inputs that never reach the mistake (a full-width ResNet-18 has 512 features). The head's input size is
written as 512 instead of being read from the old head: a narrower backbone breaks."""
from torch import nn

EXPECT = "in_features"


def replace_head(model, n_classes):
    model.fc = nn.Linear(512, n_classes)
    return model


def freeze_backbone(model):
    for name, p in model.named_parameters():
        p.requires_grad = name.startswith("fc.")
    return model
