"""Switches the model to eval mode before compiling it: the training that follows runs BatchNorm and Dropout in
their evaluation behaviour. Family: the model left in another state than the one expected."""
import torch

EXPECT = ["in train mode: after compile_model the model is in eval mode"]


def compile_model(model):
    return torch.compile(model.eval())
