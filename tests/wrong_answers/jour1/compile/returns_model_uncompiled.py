"""Compiles but returns the original model: the compiled one is thrown away."""
import torch

EXPECT = 'torch.compile'


def compile_model(model):
    torch.compile(model)
    return model
