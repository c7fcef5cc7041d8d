"""Makes the pruning permanent before counting (prune.remove on every masked layer): the value is right, but
measuring the model took its masks away."""
from torch import nn
from torch.nn.utils import prune

EXPECT = "the model was changed"


def model_sparsity(model):
    zeros = total = 0
    for module in model.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            if hasattr(module, "weight_mask"):
                prune.remove(module, "weight")
            zeros += int((module.weight == 0).sum())
            total += module.weight.numel()
    return zeros / total
