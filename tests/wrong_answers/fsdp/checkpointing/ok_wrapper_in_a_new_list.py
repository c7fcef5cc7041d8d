"""Correct: a new ModuleList of wrapped layers put in place of the old one (same names: layers.0, layers.1, ...),
the non-reentrant checkpoint wrapper."""
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper


def apply_activation_checkpointing(model):
    model.model.layers = nn.ModuleList(
        checkpoint_wrapper(layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT) for layer in model.model.layers)
    return model
