"""Wraps only the first decoder layer."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

EXPECT = 'every decoder layer'


def apply_activation_checkpointing(model):
    model.model.layers[0] = checkpoint_wrapper(model.model.layers[0])
    return model
