"""Family: part of the result right. Compiles every layer in place, then the root as well: FSDP, applied next,
would have its root unit inside a compiled graph."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = "not the root"


def compile_layers(model):
    for layer in model.model.layers:
        layer.compile()
    model.compile()
    return model
