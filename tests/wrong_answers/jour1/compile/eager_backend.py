"""Flag right, behaviour wrong: an OptimizedModule, but the eager backend only traces and fuses nothing."""
import torch

EXPECT = 'backend'


def compile_model(model):
    return torch.compile(model, backend="eager")
