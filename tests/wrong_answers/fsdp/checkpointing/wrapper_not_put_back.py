"""Wraps each layer but never puts the wrapper back into model.model.layers."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

EXPECT = 'every decoder layer'


def apply_activation_checkpointing(model):
    for layer in model.model.layers:
        layer = checkpoint_wrapper(layer)
    return model
