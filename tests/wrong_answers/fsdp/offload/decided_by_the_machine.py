"""Asks torch.cuda.is_available() instead of looking at the device: a run on the CPU of a GPU machine gets an offload policy."""
import torch
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

EXPECT = "device argument"


def offload_policy(device, enabled):
    if not enabled:
        return OffloadPolicy()
    if not torch.cuda.is_available():
        raise ValueError("CPU offload needs GPUs")
    return CPUOffloadPolicy(pin_memory=True)
