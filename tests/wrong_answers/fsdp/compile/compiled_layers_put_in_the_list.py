"""Puts torch.compile(layer) back into the list: each layer becomes a wrapper, its weights renamed _orig_mod.*"""
import torch

EXPECT = ["_orig_mod", "layer.compile()"]


def compile_layers(model):
    layers = model.model.layers
    for i, layer in enumerate(layers):
        layers[i] = torch.compile(layer)
    return model
