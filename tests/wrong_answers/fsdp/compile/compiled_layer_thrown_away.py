"""torch.compile(layer) returns a new module, which is thrown away."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = 'compile every decoder layer'


def compile_layers(model):
    for layer in model.model.layers:
        torch.compile(layer)
    return model
