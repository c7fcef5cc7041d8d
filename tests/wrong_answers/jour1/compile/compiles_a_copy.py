"""Compiles a deep copy: training the copy leaves the notebook's model untouched."""
import torch

EXPECT = 'compile the model you were given'


import copy


def compile_model(model):
    return torch.compile(copy.deepcopy(model))
