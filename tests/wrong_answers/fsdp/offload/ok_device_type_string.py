"""Correct: the device's type read from its string form, the refusal first, the pinning said explicitly."""
import torch
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy


def offload_policy(device, enabled):
    kind = str(device).split(":")[0]
    if enabled and kind != "cuda":
        raise ValueError(f"offloading to the CPU needs a GPU run: this one trains on {kind}, nothing to offload")
    if enabled:
        return CPUOffloadPolicy(pin_memory=True)
    return OffloadPolicy()
