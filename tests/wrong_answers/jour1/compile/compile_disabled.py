"""torch.compile(..., disable=True): a debugging switch that returns the model unchanged, uncompiled."""
import torch

EXPECT = ["not compiled"]


def compile_model(model):
    return torch.compile(model, disable=True)
