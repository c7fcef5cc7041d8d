"""Correct: CPUOffloadPolicy's default pins the memory; the CPU case refused first."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP


def offload_policy(device, enabled):
    if enabled and torch.device(device).type == "cpu":
        raise ValueError("nothing to offload: this run already trains on the CPU")
    return CPUOffloadPolicy() if enabled else OffloadPolicy()
