"""Another API: TorchScript's tracer records the model, it does not compile it with TorchDynamo/Inductor."""
import torch

EXPECT = 'TorchScript'


def compile_model(model):
    return torch.jit.trace(model, torch.randn(2, 3, 8, 8))
