"""Compiles the bound forward method: what comes back is a function, no longer the model (no parameters, no .train())."""
import torch

EXPECT = 'the model'


def compile_model(model):
    return torch.compile(model.forward)
