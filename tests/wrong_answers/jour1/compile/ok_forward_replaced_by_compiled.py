"""Correct: the module's forward replaced by its compiled version; the model itself is returned, keeps its
parameters, .train() and .eval(), and calling it runs the Inductor-compiled forward."""
import torch


def compile_model(model):
    model.forward = torch.compile(model.forward)
    return model
