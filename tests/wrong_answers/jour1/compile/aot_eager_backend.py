"""backend="aot_eager": traces forward and backward ahead of time but runs the same eager kernels (no fusion).
Family: the flag right (an OptimizedModule), the behaviour not."""
import torch

EXPECT = ["only traces the model"]


def compile_model(model):
    return torch.compile(model, backend="aot_eager")
