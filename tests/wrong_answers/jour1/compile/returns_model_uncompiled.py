"""Compiles but returns the original model: the compiled one is thrown away."""
import torch

EXPECT = 'not compiled'


def compile_model(model):
    torch.compile(model)
    return model
