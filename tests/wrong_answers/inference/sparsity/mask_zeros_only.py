"""On a pruned layer counts the zeros of the mask: the zeros weight_orig already had before pruning are missed."""
from torch import nn

EXPECT = "weight_mask"


def model_sparsity(model):
    zeros = total = 0
    for module in model.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            counted = module.weight_mask if hasattr(module, "weight_mask") else module.weight
            zeros += int((counted == 0).sum())
            total += counted.numel()
    return zeros / total
