"""Family: a flag set but the behaviour wrong. Every layer is put in a wrapper called CheckpointWrapper, but the
wrapper simply calls the layer: all activations are stored as before and nothing is recomputed in backward."""
import torch

EXPECT = ["ran their forward", "recomputed as a whole in backward"]


class CheckpointWrapper(torch.nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, *args, **kwargs):
        return self.layer(*args, **kwargs)


def apply_activation_checkpointing(model):
    layers = model.model.layers
    for i, layer in enumerate(layers):
        layers[i] = CheckpointWrapper(layer)
    return model
