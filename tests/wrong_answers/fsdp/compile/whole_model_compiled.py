"""torch.compile(model): one graph around the root, which FSDP wraps next."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = ["the root model is compiled", "compile every decoder layer"]


def compile_layers(model):
    return torch.compile(model)
