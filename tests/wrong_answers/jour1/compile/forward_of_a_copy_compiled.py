"""Compiles the forward of a copy and returns that copy: calling it is compiled, but the optimizer built on the
notebook's model updates other parameters. Family: the flag right (compiled), the object wrong."""
import copy

import torch

EXPECT = "another module"


def compile_model(model):
    twin = copy.deepcopy(model)
    twin.forward = torch.compile(twin.forward)
    return twin
