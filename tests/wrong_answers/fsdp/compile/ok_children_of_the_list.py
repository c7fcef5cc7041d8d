"""Correct: each decoder layer reached through the ModuleList's children and compiled in place."""


def compile_layers(model):
    for layer in model.model.layers.children():
        layer.compile()
    return model
