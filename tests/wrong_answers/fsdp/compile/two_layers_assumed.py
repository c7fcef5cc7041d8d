"""Family: inputs that never reach the mistake. Compiles layers 0 and 1, the smoke model's two layers, by index: a
deeper model keeps its other layers uncompiled."""
import torch

EXPECT = ["decoder layer(s) [2] of 3 are not compiled", "compile every decoder layer"]


def compile_layers(model):
    for i in range(2):
        if i < len(model.model.layers):
            model.model.layers[i].compile()
    return model
