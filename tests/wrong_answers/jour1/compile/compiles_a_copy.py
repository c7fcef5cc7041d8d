"""Compiles a deep copy: training the copy leaves the notebook's model untouched."""
import torch

EXPECT = 'another module'


import copy


def compile_model(model):
    return torch.compile(copy.deepcopy(model))
