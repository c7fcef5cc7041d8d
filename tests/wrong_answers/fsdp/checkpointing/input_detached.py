"""Family: values checked, gradients not. A checkpoint wrapper of its own that hands the layer a detached copy of
its input: the outputs are right and every layer's own weights get their gradients, but no gradient flows back
through the layers to the ones before them and to the embeddings."""
import torch
from torch.utils.checkpoint import checkpoint

EXPECT = ["the gradient", "without checkpointing"]


class CheckpointWrapper(torch.nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x, *args, **kwargs):
        return checkpoint(self.layer, x.detach(), *args, use_reentrant=False, **kwargs)


def apply_activation_checkpointing(model):
    layers = model.model.layers
    for i, layer in enumerate(layers):
        layers[i] = CheckpointWrapper(layer)
    return model
