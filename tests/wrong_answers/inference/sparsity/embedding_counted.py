"""Counts the weight of every module whose weight is a matrix or more ("the layers with a weight matrix"): an
Embedding's table is counted with the Conv2d and Linear weights."""
import torch

EXPECT = "Embedding"


def model_sparsity(model):
    zeros = total = 0
    for module in model.modules():
        w = getattr(module, "weight", None)
        if isinstance(w, torch.Tensor) and w.dim() > 1:
            zeros += int((w == 0).sum())
            total += w.numel()
    return zeros / total
